#!/usr/bin/env bash
# On the lent GPU machine: install the carried wheels, run the GPU tests (and
# whatever else is asked: `scripts/gpu_run.sh bench` (options of bench.run in
# $BENCH_ARGS, e.g. BENCH_ARGS="--kernels deepseek"), `scripts/gpu_run.sh tp` on every
# GPU of the machine), logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MONO_CACHE_DIR=/tmp/mono-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
status=0
for what in "${@:-tests}"; do
    case "$what" in
        tests) python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu-tests.log"; status=$((status | PIPESTATUS[0])) ;;
        bench) python3 -m bench.run ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"; status=$((status | PIPESTATUS[0])) ;;
        tp) NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --nproc-per-node "$(nvidia-smi -L | wc -l)" \
                scripts/tp_run.py 2>&1 | tee "$OUT/tp-run.log"; status=$((status | PIPESTATUS[0])) ;;
        *) echo "unknown step $what"; status=1 ;;
    esac
done
exit $status
