"""Where a sampled launch's warps wait, by stage and function (CPU): Nsight Compute's
per-instruction warp-state samples (its source page as CSV, scripts/ncu_run.sh) read against
the same CUBIN's line info (nvdisasm -gi), each instruction given to its stage and function as
scripts/code_footprint.py gives them.

    PYTHONPATH=. python3 scripts/ncu_stalls.py CASE.sass.csv CASE.cubin \
        generated/minimax_m3/pre_attn.sm90.s16.hip [--top N]

A sample is one warp at one instant (issuing, or stalled for one reason), so a stage's share
of the samples is its share of warp-time, idle warps included (a warp at a barrier counts).
The reasons are ncu's (stall_no_inst: the warp's next instruction not fetched yet;
long_sb: a global load's scoreboard; barrier: a CTA or named barrier; wait: a fixed-latency
dependency; selected: issuing). The CUBIN must be the profiled one (the device's nvrtc may
build other addresses than this machine's)."""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

from scripts.code_footprint import instructions, owners
from scripts.sass_scoreboards import nvdisasm

SHOWN = ("no_inst", "long_sb", "barrier", "wait", "short_sb", "selected", "not_selected", "math", "branch_resolving",
         "imc", "lg", "mio", "membar", "dispatch")


def located(listing: str, source: str) -> dict[int, tuple[str, str | None, int, str]]:
    """Each instruction's offset -> (stage, function, source line, SASS) from a `-gi` listing."""
    return {offset: (*owner, sass) for (offset, sass, _), owner in zip(instructions(listing), owners(source, listing))}


def samples(path: Path) -> list[dict]:
    """The source page's rows (one an instruction): offset, SASS, and samples per reason."""
    rows = list(csv.reader(path.open()))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names, body = rows[head], rows[head + 1:]
    base = int(body[0][0], 16)
    out = []
    for r in body:
        d = dict(zip(names, r))
        reasons = {k[len("stall_"):]: int(v or 0) for k, v in d.items()
                   if k.startswith("stall_") and "Not Issued" not in k}  # (its twin: the same samples again)
        out.append({"offset": int(d["Address"], 16) - base, "sass": d["Source"].strip(), "reasons": reasons,
                    "executed": int(d.get("Instructions Executed") or 0)})
    return out


def table(title: str, groups: dict, total: int, top: int) -> str:
    lines = [f"\n| {title} | samples | share | " + " | ".join(SHOWN) + " |",
             "|---|---:|---:|" + "---:|" * len(SHOWN)]
    for key, reasons in sorted(groups.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        n = sum(reasons.values())
        lines.append(f"| {key} | {n} | {100 * n / total:.1f} % | " + " | ".join(
            f"{100 * reasons[r] / n:.0f}" if reasons[r] else "" for r in SHOWN) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass_csv", type=Path, help="ncu --page source --csv --print-source sass of one profiled launch")
    ap.add_argument("cubin", type=Path, help="the profiled CUBIN (scripts/ncu_probe.py wrote it)")
    ap.add_argument("hip", type=Path, help="its source (the generated sm90 file of the same build)")
    ap.add_argument("--top", type=int, default=15, help="functions and instructions listed (default 15)")
    args = ap.parse_args()
    text = subprocess.run([nvdisasm(), "-gi", "-c", str(args.cubin)], check=True, capture_output=True, text=True).stdout
    where = located(text, args.hip.read_text())
    rows = samples(args.sass_csv)
    missing = [r["offset"] for r in rows if r["offset"] not in where]
    if missing or len(where) != len(rows):
        sys.exit(f"the CSV ({len(rows)} instructions) and the CUBIN ({len(where)}) differ "
                 f"(first offset not in the CUBIN: {missing[:1]}): profile and disassemble the same binary")
    mismatched = [r for r in rows if r["sass"].split()[0] != where[r["offset"]][3].split()[0]]
    if mismatched:
        sys.exit(f"{len(mismatched)} instructions differ between the CSV and the CUBIN, e.g. "
                 f"{mismatched[0]['sass']!r} at {mismatched[0]['offset']:#x}")
    per_stage: dict = defaultdict(Counter)
    per_func: dict = defaultdict(Counter)
    per_reason: Counter = Counter()
    for r in rows:
        st, fn, _, _ = where[r["offset"]]
        per_stage[st].update(r["reasons"])
        per_func[f"{st}: {fn}"].update(r["reasons"])
        per_reason.update(r["reasons"])
    total = sum(per_reason.values())
    print(f"{args.sass_csv.name}: {total} warp samples, {len(rows)} instructions; reasons in % of each row's samples")
    print(table("all", {"kernel": per_reason}, total, 1))
    print(table("stage", per_stage, total, args.top))
    print(table("stage: function", per_func, total, args.top))
    print("\n| instruction | line | samples | share | top reasons |\n|---|---|---:|---:|---|")
    for r in sorted(rows, key=lambda r: -sum(r["reasons"].values()))[:args.top]:
        st, fn, line, sass = where[r["offset"]]
        n = sum(r["reasons"].values())
        top = ", ".join(f"{k} {v}" for k, v in Counter(r["reasons"]).most_common(3) if v)
        print(f"| {r['offset']:#06x} `{sass[:48]}` | {st}: {fn} {line} | {n} | {100 * n / total:.1f} % | {top} |")


if __name__ == "__main__":
    sys.exit(main())
