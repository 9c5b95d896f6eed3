#!/usr/bin/env bash
# Before a device call that tries experiment branches against main (scripts/gpu_run.sh branches, or
# scripts/ab_variants.py's --variant NAME .br-<branch>):
# main's tree into .ab-main and each branch's tree into .br-<branch, / as ->, plain copies (the lent
# machine copies untracked files, not git history; git ignores none of these, so they travel).
# Remove them afterwards: rm -rf .ab-main .br-*
#   scripts/prep_branches.sh exp/qkv-token-pairs exp/qkv-free-ctas
#   scripts/prep_branches.sh            (no branch: .ab-main alone, main against this checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .ab-main && mkdir .ab-main && git archive main | tar -x -C .ab-main
echo "main -> .ab-main ($(git rev-parse --short main))"
for b in "$@"; do
    d=.br-${b//\//-}
    rm -rf "$d" && mkdir "$d" && git archive "$b" | tar -x -C "$d"
    echo "$b -> $d ($(git rev-parse --short "$b"))"
done
