#!/bin/bash
# A/B bench on the lent GPU: a reference tree (A, in .ab-main) against the working tree (B), by
# turns in one call, so that both run on the same machine (medians of one build differ between
# machines by up to ~0.15 us; bench/NOTES.md).
#
# Here, before the call:   rm -rf .ab-main && mkdir .ab-main && git archive main | tar -x -C .ab-main
# (a plain copy, not a worktree: the lent machine copies untracked files, not nested checkouts);
# remove .ab-main afterwards.
# There:                   AB_ROUNDS=2 AB_ARGS="--kernels deepseek --tokens 1,2" scripts/gpu_run.sh ab
#                          (or scripts/ab_bench.sh ROUNDS [bench.run args]: the carried .whl wheels go
#                          into $SITE, default /tmp/site, when pydantic is not there yet: a fresh machine)
# Each run: no-compile, 30 replays; its log in $OUT/ab-<A|B><round>.log, its table printed.
set -u
rounds=${1:?usage: scripts/ab_bench.sh ROUNDS [bench.run args]}
shift
root=$PWD
[ -d "$root/.ab-main" ] || { echo "no .ab-main: see this script's header" >&2; exit 2; }
site=${SITE:-/tmp/site}
if [ ! -d "$site/pydantic" ]; then  # a fresh machine: the carried wheels first (scripts/gpu_wheels.sh)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$root"/.whl/*.whl || { echo "no wheels in $site nor .whl/: run scripts/gpu_wheels.sh here, carry .whl" >&2; exit 2; }
fi
out=${OUT:-/tmp}
for r in $(seq 1 "$rounds"); do
    for side in A B; do
        if [ $side = A ]; then dir=$root/.ab-main; else dir=$root; fi
        log=$out/ab-$side$r.log
        (cd "$dir" && PYTHONPATH="$site:$dir" timeout 300 python3 -m bench.run --replays 30 --no-jit \
            --no-generate --no-compile --no-plot --results "/tmp/ab-$side$r.md" --out "/tmp/ab-$side$r" "$@" >"$log" 2>&1)
        echo "== $side$r (exit $?)"
        grep -E "^ ?[0-9]+ +[0-9]" "$log" | sed 's/^/  /'
    done
done
