#!/usr/bin/env bash
# `scripts/gpu_run.sh ncu` on the lent GPU machine (its wheels, PYTHONPATH and OUT): Nsight
# Compute's warp-state sampling of MiniMax pre_attn builds
# (scripts/ncu_probe.py launches each as the bench does; the 11th launch is profiled, caches
# flushed before it as ncu does by default, clocks left alone). Each case is "TOKENS CONTEXT
# [stage.field=value ...]" in NCU_CASES, separated by ';' (default: S = 1 and 16 at 4K, S = 16
# at 64K); NCU_FLAGS adds ncu options (e.g. "--cache-control none": the profiled launch finds
# in L2 what the launches before it left, as in the bench; NCU_TAG then names the files). For
# each it keeps the report's details and raw metrics and its per-instruction source page as
# CSV, and the CUBIN; all packed into $OUT/ncu.tgz (only 8 files come back), read on the CPU by
# scripts/ncu_stalls.py.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?run it as scripts/gpu_run.sh ncu}"
work=$(mktemp -d)
ncu --version | tail -1; ncu --help | grep -i -A1 "sampling-interval\|print-source" | head -12
IFS=';' read -ra cases <<< "${NCU_CASES:-1 4096;16 4096;16 65536}"
for case in "${cases[@]}"; do
    read -ra words <<< "$case"
    tune="${words[*]:2}"; tune="${tune//scores./}"  # in the files' names: the knobs, stage names dropped
    tag="s${words[0]}_$((words[1] / 1024))k${NCU_TAG:-}${tune:+_${tune//[^A-Za-z0-9]/-}}"
    ncu --clock-control none -k minimax_m3_pre_attn --launch-skip 10 --launch-count 1 \
        --section WarpStateStats --section SourceCounters --section SchedulerStats --section SpeedOfLight \
        --warp-sampling-interval 0 ${NCU_FLAGS:-} -f -o "$work/$tag" \
        python3 scripts/ncu_probe.py --cold-keys "${words[@]:0:2}" "$work/$tag" "${words[@]:2}" 2>&1 | tail -5
    ncu -i "$work/$tag.ncu-rep" --page details --csv > "$work/$tag.details.csv" 2> "$work/$tag.err"
    ncu -i "$work/$tag.ncu-rep" --page raw --csv > "$work/$tag.raw.csv" 2>> "$work/$tag.err"
    ncu -i "$work/$tag.ncu-rep" --page source --csv --print-source sass > "$work/$tag.sass.csv" 2>> "$work/$tag.err" \
        || ncu -i "$work/$tag.ncu-rep" --page source --csv > "$work/$tag.sass.csv" 2>> "$work/$tag.err"
    wc -c "$work/$tag".* | head -8
    grep -i "stall\|warp cycles per issued" "$work/$tag.details.csv" | cut -c1-200 | head -30
done
tar -C "$work" -czf "$OUT/ncu.tgz" --exclude='*.ncu-rep' .
