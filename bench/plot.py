"""``python -m bench.plot BENCH_JSON [--png PATH] [--append-results PATH]``:
the plot (and, if asked, the bench/RESULTS.md entry) from a saved run's
bench.json, for runs on machines without matplotlib or whose bench/ folder
is not kept (the lent GPU machine: its $OUT comes back, its tree does not)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.splitlines()[0])
    ap.add_argument("json", help="bench.json of a run")
    ap.add_argument("--png", default=str(ROOT / "bench" / "pre_attn.png"), help="plot to write")
    ap.add_argument("--append-results", default=None, metavar="PATH",
                    help="also append the run's markdown entry to PATH (e.g. bench/RESULTS.md)")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    meta, rows = data["meta"], data["cases"]
    why = report.plot(rows, Path(args.png), f"{meta['kernel']} on {meta['gpu']} ({meta['commit']})")
    print(why or f"plot: {args.png}")
    if args.append_results:
        extras = {k: v for k, v in data.items() if k not in ("meta", "cases")}
        report.append_results(Path(args.append_results), report.markdown_entry(meta, rows, extras))
        print(f"appended to {args.append_results}")
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
