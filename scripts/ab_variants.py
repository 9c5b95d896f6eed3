"""Several builds side by side on the lent GPU, by turns in one call: each variant is a tree (this
checkout, main's copy in .ab-main, a branch's in .br-<name>: scripts/prep_branches.sh) and spec
overrides (bench.run --tune), timed with bench.run's no-compile path, ours only, in rounds
(variant 1, 2, .., then again), so that every variant sees the same machine: medians of one build
move by up to ~0.7 us between machines (bench/NOTES.md, DeepSeek session 17).

    python3 scripts/ab_variants.py --rounds 2 --bench "--kernels deepseek --tokens 3,6,16" \\
        --variant main .ab-main --variant new . --variant pairs-off . symbols.QKV_PER_TASK=1 \\
        --variant no-pdl . run:--no-pdl

Prints a line a run and, at the end, a table: a row a variant, a column a case (S, or S / context),
the mean of the rounds' medians (us) and, with two rounds or more, their spread. The table goes to
$OUT/variants.md too, every run's bench.run output to $OUT/variants.log (two files: only 8 come
back from a call). Needs the carried wheels installed (scripts/gpu_run.sh does it; or PYTHONPATH
with pydantic)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", nargs="+", action="append", required=True, metavar=("NAME DIR", "TUNE"),
                    help="a variant: its name, its tree (relative to this checkout), then STAGE.FIELD=VALUE overrides "
                         "(or run:OPTION, an option of bench.run for this variant's runs, e.g. run:--no-pdl)")
    ap.add_argument("--rounds", type=int, default=2, help="turns over all variants (default 2)")
    ap.add_argument("--bench", default="--kernels deepseek", help="bench.run's options for every run, one string")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a run may take (default 300)")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: bench.run --dry-run (fake times)")
    args = ap.parse_args(argv)
    for v in args.variant:
        if len(v) < 2:
            ap.error(f"--variant {' '.join(v)}: NAME DIR [TUNE ...] expected")
        if not (ROOT / v[1] / "bench" / "run.py").is_file():
            ap.error(f"--variant {v[0]}: {v[1]} is no checkout (no bench/run.py under {ROOT / v[1]})")
        bad = [t for t in v[2:] if "=" not in t and not t.startswith("run:--")]
        if bad:
            ap.error(f"--variant {v[0]}: {bad[0]!r} is no STAGE.FIELD=VALUE override (nor run:--OPTION)")
    names = [v[0] for v in args.variant]
    if len(set(names)) != len(names):
        ap.error(f"variant names must differ: {names}")
    return args


def run_once(tree: Path, tunes: list[str], bench: str, timeout: int, dry: bool, log) -> dict[str, float]:
    """One bench.run in ``tree``: case label -> ours us (an empty dict when it failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "bench.run", "--replays", "30", "--no-jit", "--no-generate", "--no-compile",
               "--no-plot", "--out", tmp, "--results", str(Path(tmp) / "RESULTS.md"), *shlex.split(bench)]
        cmd += [w for t in tunes for w in ((t[len("run:"):],) if t.startswith("run:") else ("--tune", t))]
        cmd += ["--dry-run"] if dry else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(tree)) if p))
        try:
            done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
            log.write(f"$ (cd {tree} && {shlex.join(cmd[1:])})  # exit {done.returncode}\n{done.stdout}{done.stderr}\n")
        except subprocess.TimeoutExpired:
            log.write(f"$ (cd {tree} && {shlex.join(cmd[1:])})  # stopped after {timeout} s\n")
        out = Path(tmp) / "bench.json"
        if not out.exists():
            return {}
        cases = json.loads(out.read_text())["cases"]
        return {case_label(c): c["ours_us"] for c in cases if c.get("ours_us") is not None}


def case_label(case: dict) -> str:
    ctx = case.get("context")
    return f"{case['tokens']}" if ctx is None else f"{case['tokens']}/{ctx // 1024}K"


def table(results: dict[str, list[dict[str, float]]]) -> str:
    labels: list[str] = []
    for runs in results.values():
        for run in runs:
            labels += [k for k in run if k not in labels]
    lines = ["| variant | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, runs in results.items():
        cells = []
        for k in labels:
            xs = [r[k] for r in runs if k in r]
            if not xs:
                cells.append("-")
            elif len(xs) == 1:
                cells.append(f"{xs[0]:.2f}")
            else:
                cells.append(f"{statistics.fmean(xs):.2f} ({max(xs) - min(xs):.2f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(os.environ.get("OUT", "/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, float]]] = {v[0]: [] for v in args.variant}
    failed = False
    with open(out / "variants.log", "w") as log:
        for r in range(1, args.rounds + 1):
            for name, tree, *tunes in args.variant:
                got = run_once((ROOT / tree).resolve(), tunes, args.bench, args.timeout, args.dry_run, log)
                log.flush()
                failed |= not got
                results[name].append(got)
                print(f"== {name} (round {r}): " + ("  ".join(f"{k}:{v:.2f}" for k, v in got.items()) or "FAILED: see variants.log"),
                      flush=True)
    text = table(results) + "\n\nmean of the rounds' medians, us (spread: max - min); bench.run " + args.bench + "\n"
    (out / "variants.md").write_text(text)
    print("\n" + text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
