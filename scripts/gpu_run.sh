#!/usr/bin/env bash
# On the lent GPU machine: install the carried wheels, then run the steps asked for
# (default: tests), logs under $OUT (more than 8 files: packed into $OUT/logs.tgz, as only 8 come back):
#   tests     pytest -m gpu (TEST_ARGS picks files, e.g. TEST_ARGS=tests/test_ops_gpu.py; TEST_K a -k
#             expression, spaces and all, e.g. TEST_K="not index"; TEST_N: that many pytest-xdist worker
#             processes, e.g. TEST_N=8: the MiniMax file's ~270 cases are host-bound, one process ~9 min)
#   bench     python -m bench.run (its options in BENCH_ARGS, e.g. "--kernels deepseek", or a variant's
#             "--kernels minimax --tune scores.busy_waves=16": the entry names it); give it
#             BENCH_COMMIT=<this checkout's HEAD, written out> for RESULTS.md: the lent
#             machine's own git checkout may be an older one
#   timeline  both kernels' per-stage timelines (scripts/timeline_*.py)
#   probes    the DeepSeek timeline with each of DS_PROBES ("a=1 b=2;c=3"; default: the spare points
#             on the qkv stage, on wq_b, on wqkv_a: where each stage's time goes; an entry may add
#             --slowest=POINT: the CTAs that stamped POINT last, with all their stamps)
#   branches  each experiment branch copied here by scripts/prep_branches.sh (.br-*): its GPU tests
#             (TEST_ARGS, default tests/test_deepseek_front_gpu.py, TEST_K a -k expression; logs under
#             $OUT/<branch folder>/), then one scripts/ab_variants.py table: main's tree (.ab-main) and every
#             branch, AB_ROUNDS turns (default 2; 0: the tests alone, e.g. before a `variants` step that
#             times a branch's tunes), AB_ARGS for bench.run (default "--kernels deepseek")
#   variants  scripts/ab_variants.py with VARIANT_ARGS (its options, shell-quoted, e.g.
#             VARIANT_ARGS='--bench "--kernels deepseek --tokens 3,16" --variant main .ab-main
#             --variant new . --variant new-tp2 . symbols.WQB_CTAS=132'): builds side by side in
#             rounds, one table ($OUT/variants.md)
#   tp        scripts/tp_run.py on every GPU of the machine
#   offset    scripts/compile_offset_probe.py with OFFSET_ARGS (e.g. "--tokens 6 --steps tunes"): ours in
#             the states a with-compile bench run leaves (DeepSeek's second state, bench/NOTES.md)
#   stream    scripts/stream_probe.py at both kernels' weight bytes (DeepSeek's 19660800, MiniMax's
#             default): one launch that only streams them, against the copy floor (the bound below ours)
#   phase     scripts/stream_probe.py --phase: when each CTA's first piece of its weight share lands, and
#             whether the late CTAs sit at one phase of an address period (bench/NOTES.md MiniMax session 50)
#   bycta     MiniMax timelines by CTA (scripts/timeline_probe.py --cold-keys --by-cta=BYCTA_POINT, default
#             gemv_done, at BYCTA_TOKENS, default 1): each of BYCTA_TUNES ("a=1 b=2;c=3"; default the spec's
#             build), every CTA's median in order (e.g. BYCTA_POINT=spare BYCTA_TUNES="qkv.first_staged_point=spare"),
#             then the runs joined CTA by CTA (scripts/bycta_join.py: the steps between the stamps)
#   scorer    the MiniMax scorer's variants side by side (scripts/timeline_probe.py --cold-keys,
#             S = 1 / 4 / 16 at 4K and 64K): the spec's, then each of SCORER_TUNES ("a=1 b=2;c=3")
#   host      scripts/host_launch_time.py: host time of an eager launch, checked against bound (kernel.bind)
#   launch    the GPU tests of the launch path (argument checks, prepared and bound launches, PDL, graphs,
#             the device check; ~80 s on 8 workers, H100): after a change to codegen/launch.py or codegen/jit
#   ncu       Nsight Compute's warp samples of MiniMax builds (scripts/ncu_run.sh: NCU_CASES,
#             NCU_FLAGS, NCU_TAG), as $OUT/ncu.tgz for scripts/ncu_stalls.py
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MONO_CACHE_DIR=/tmp/mono-cache
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
status=0
# The command after $1, once with each tune of $1 ("a=1 b=2;c=3"; an empty tune, or none at all: the
# spec's build) appended, under a "=== tune" line; fails if any run failed
over_tunes() {
    local list=$1 tune rc=0
    shift
    IFS=';' read -ra tunes <<< "$list"
    [ ${#tunes[@]} -eq 0 ] && tunes=("")
    for tune in "${tunes[@]}"; do
        echo "=== ${tune:-spec}"
        # shellcheck disable=SC2086  # a tune is several words
        "$@" $tune 2>&1 || rc=1
    done
    return $rc
}
for what in "${@:-tests}"; do
    case "$what" in
        tests) python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 ${TEST_N:+-n "$TEST_N"} ${TEST_K:+-k "$TEST_K"} ${TEST_ARGS:-tests} 2>&1 \
                | tee "$OUT/gpu-tests.log"; status=$((status | PIPESTATUS[0])) ;;
        bench) python3 -m bench.run ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"; status=$((status | PIPESTATUS[0])) ;;
        timeline) { python3 scripts/timeline_probe.py 1 4 16 && python3 scripts/timeline_deepseek_front.py; } 2>&1 \
                | tee "$OUT/timeline.log"; status=$((status | PIPESTATUS[0])) ;;
        offset) # shellcheck disable=SC2086  # OFFSET_ARGS is several words
                python3 scripts/compile_offset_probe.py ${OFFSET_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/offset.log"
                status=$((status | PIPESTATUS[0])) ;;
        stream) { python3 scripts/stream_probe.py 19660800 && python3 scripts/stream_probe.py; } 2>&1 \
                | tee "$OUT/stream.log"; status=$((status | PIPESTATUS[0])) ;;
        phase) python3 scripts/stream_probe.py --phase 2>&1 | tee "$OUT/phase.log"; status=$((status | PIPESTATUS[0])) ;;
        bycta) # shellcheck disable=SC2086  # BYCTA_TOKENS: several numbers
                over_tunes "${BYCTA_TUNES:-}" python3 scripts/timeline_probe.py --cold-keys \
                    --by-cta="${BYCTA_POINT:-gemv_done}" ${BYCTA_TOKENS:-1} | grep -v Warning | tee "$OUT/bycta.log"
                status=$((status | PIPESTATUS[0]))
                python3 scripts/bycta_join.py "$OUT/bycta.log" --point="${BYCTA_POINT:-gemv_done}" 2>&1 | tee "$OUT/bycta-join.log" ;;
        scorer) over_tunes ";${SCORER_TUNES:-scores.busy_waves=16;scores.busy_waves=1;scores.tiles_ahead=2 scores.key_regs=0}" \
                    python3 scripts/timeline_probe.py --cold-keys 1 4 16 | grep "^===\|^S=\|graph replay\|scores_done" \
                    | tee "$OUT/scorer.log"; status=$((status | PIPESTATUS[0])) ;;
        probes) over_tunes "${DS_PROBES:-qkv.got_point=spare qkv.quant_point=spare2;wq_b.rows_point=spare wq_b.unit_point=spare2;wqkv_a.rows_point=spare wqkv_a.unit_point=spare2}" \
                    python3 scripts/timeline_deepseek_front.py | tee "$OUT/probes.log"; status=$((status | PIPESTATUS[0])) ;;
        branches) [ -d .ab-main ] && compgen -G ".br-*/" >/dev/null || { echo "no .ab-main / .br-*: scripts/prep_branches.sh"; status=1; continue; }
                variants=(--variant main .ab-main)
                for dir in .br-*/; do  # (not in a pipe: status is this shell's)
                    dir=${dir%/}; mkdir -p "$OUT/$dir"
                    echo "=== $dir"
                    (cd "$dir" && PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider \
                        ${TEST_K:+-k "$TEST_K"} ${TEST_ARGS:-tests/test_deepseek_front_gpu.py} >"$OUT/$dir/gpu-tests.log" 2>&1)
                    status=$((status | $?)); tail -1 "$OUT/$dir/gpu-tests.log"
                    variants+=(--variant "${dir#.br-}" "$dir")
                done > >(tee "$OUT/branches.log") 2>&1
                [ "${AB_ROUNDS:-2}" -gt 0 ] || continue
                python3 scripts/ab_variants.py --rounds "${AB_ROUNDS:-2}" --bench "${AB_ARGS:---kernels deepseek}" "${variants[@]}" 2>&1 \
                    | tee -a "$OUT/branches.log"; status=$((status | PIPESTATUS[0])) ;;
        variants) eval "python3 scripts/ab_variants.py ${VARIANT_ARGS:?VARIANT_ARGS: scripts/ab_variants.py --help}" 2>&1 \
                | tee "$OUT/variants.out"; status=$((status | PIPESTATUS[0])) ;;
        launch) python3 -m pytest -q -m gpu -p no:cacheprovider -n "${TEST_N:-8}" \
                    -k "bound or launch or pdl or graph or device or argument or shar" tests/test_jit.py \
                    tests/test_minimax_pre_attn_gpu.py tests/test_deepseek_front_gpu.py tests/test_reliability_gpu.py \
                    tests/test_launch_args.py 2>&1 | tee "$OUT/launch-tests.log"; status=$((status | PIPESTATUS[0])) ;;
        host) python3 scripts/host_launch_time.py 2>&1 | grep -v Warning | tee "$OUT/host.log"; status=$((status | PIPESTATUS[0])) ;;
        ncu) bash scripts/ncu_run.sh 2>&1 | grep -v '^"' | tee "$OUT/ncu.log"; status=$((status | PIPESTATUS[0])) ;;
        tp) NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --nproc-per-node "$(nvidia-smi -L | wc -l)" \
                scripts/tp_run.py 2>&1 | tee "$OUT/tp-run.log"; status=$((status | PIPESTATUS[0])) ;;
        *) echo "unknown step $what"; status=1 ;;
    esac
done
# At most 8 files come back from $OUT (/work/.library/device/README.md): more go back as one archive
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
    tar czf /tmp/gpu-run-logs.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu-run-logs.tgz "$OUT/logs.tgz"
fi
exit $status
