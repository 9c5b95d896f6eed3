"""``python -m bench.plot BENCH_JSON [--png-dir DIR] [--append-results PATH]``:
the plots (and, if asked, the bench/RESULTS.md entries) from a saved run's
bench.json, for runs on machines without matplotlib or whose bench/ folder
is not kept (the lent GPU machine: its $OUT comes back, its tree does not)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.splitlines()[0])
    ap.add_argument("json", help="bench.json of a run")
    ap.add_argument("--png-dir", default=str(ROOT / "bench"),
                    help="folder for the plots (one per kernel: pre_attn.png, attn_front.png)")
    ap.add_argument("--append-results", default=None, metavar="PATH",
                    help="also append the run's markdown entries to PATH (e.g. bench/RESULTS.md)")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    if "kernels" in data:  # one run of several kernels
        runs = [(r["meta"], r["cases"], r.get("png") or r["meta"]["kernel"].split("/")[-1] + ".png",
                 {k: v for k, v in (("jit", r.get("jit")),) if v})
                for r in data["kernels"].values() if r.get("cases") and "copies" in r["meta"]]
    else:  # a single-kernel run (older bench.json)
        runs = [(data["meta"], data["cases"], "pre_attn.png", {})]
    common = {k: v for k, v in data.items() if k not in ("meta", "cases", "kernels")}
    if args.append_results:
        for meta, *_ in runs:
            why = unknown_commit(meta.get("commit", ""))
            if why:
                print(f"error: {why}", file=sys.stderr)
                return 2
    status = 0
    for i, (meta, rows, png, own) in enumerate(runs):
        path = Path(args.png_dir) / png
        why = report.plot(rows, path, report.plot_title(meta))
        print(why or f"plot: {path}")
        status |= 1 if why else 0
        if args.append_results:
            extras = {"copy_bandwidth": common.get("copy_bandwidth", {}), **own}
            if i == 0 and "generate" in common:
                extras["generate"] = common["generate"]
            report.append_results(Path(args.append_results), report.markdown_entry(meta, rows, extras))
            print(f"appended {meta['kernel']} to {args.append_results}")
    return status


def unknown_commit(commit: str) -> str | None:
    """Why a run's commit may not go into RESULTS.md: it must name a commit of this repository
    (a "+modified" mark, a tree that differed from it, is kept and said)."""
    rev = commit.removesuffix("+modified")
    found = subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True)
    if not rev or found.returncode != 0:
        return (f"the run's commit {commit!r} is not a commit of this repository: run the bench with "
                "BENCH_COMMIT=<this checkout's HEAD, written out> (the lent machine's git checkout may be "
                "an older one), or fix meta.commit in the bench.json")
    return None


if __name__ == "__main__":
    sys.exit(main())
