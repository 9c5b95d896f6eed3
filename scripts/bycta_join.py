"""Join `scripts/timeline_probe.py --by-cta` runs into one per-CTA view (CPU; reads their logs).

One by-CTA run gives one point's per-CTA medians; a stage's steps need several (e.g. `gpu_run.sh
bycta` with BYCTA_TUNES="qkv.staged_point=spare;qkv.mmas_point=spare", each tune a run of the
spare point at a different place). Per case (tokens and context) this prints each run's median,
then the runs in the order of their medians, each step between neighbours taken CTA by CTA (the
median / min / max over the CTAs that stamp both: a step's own spread, which the medians of two
distributions hide), and the CTAs latest at the last run with every run's value.
--previous=A,B adds run B's step from run A's value on the CTA before (a stream-K tail against the
previous CTA's head piece: qkv.piece_point,qkv.tail_point; is the tail waiting for its neighbour?).

Each run's label: the keys its tune sets to POINT (--point, default spare: the by-CTA point the
runs stamp, e.g. qkv.mmas_point), then its other settings (qkv.tail_point scores.keys_prefetch=0).
Runs of the same build on different calls are different launches: a step between them is only as
good as the halves' correlations the probe printed (near 1: each CTA's time is its place's).

Usage: python scripts/bycta_join.py LOG [LOG ...] [--point=spare] [--previous=A,B] [--latest=N]
"""

import ast
import re
import statistics
import sys
from collections import defaultdict

HEADER = re.compile(r"^(S=\d+ contexts=\[[\d, ]*\])\s+(\{.*?\}|None)")


def runs(text: str, point: str = "spare") -> dict:
    """{case: {label: {cta: us}}} from one log: each header's tune labels the next 'every CTA' line."""
    out, case, label = defaultdict(dict), None, None
    for line in text.splitlines():
        head = HEADER.match(line)
        if head:
            case = head.group(1)
            tune = ast.literal_eval(head.group(2)) or {}
            label = " ".join([k for k, v in tune.items() if v == point] +
                             [f"{k}={v}" for k, v in tune.items() if v != point]) or "spec"
        elif "every CTA, in order:" in line and case is not None:
            values = re.findall(r"(\d+):([\d.]+)", line.split("in order:", 1)[1])
            out[case][label] = {int(c): float(us) for c, us in values}
    return out


def order(per_label: dict) -> list[str]:
    """The runs' labels in the order of their medians over the CTAs."""
    return sorted(per_label, key=lambda k: statistics.median(per_label[k].values()))


def step(name: str, diffs: list[float]) -> list[tuple[str, float, float, float]]:
    """[(name, median, min, max)] of one step's per-CTA differences; none without a CTA in both."""
    return [(name, statistics.median(diffs), min(diffs), max(diffs))] if diffs else []


def steps(per_label: dict, previous: tuple[str, str] | None = None) -> list[tuple[str, float, float, float]]:
    """(name, median, min, max) of each step between neighbouring runs in the order of their
    medians, CTA by CTA; previous (A, B): then B against A on the CTA before."""
    labels, rows = order(per_label), []
    for a, b in zip(labels, labels[1:]):
        rows += step(f"{a} -> {b}", [per_label[b][c] - per_label[a][c] for c in per_label[b] if c in per_label[a]])
    if previous and all(k in per_label for k in previous):
        a, b = (per_label[k] for k in previous)
        rows += step(f"{previous[0]} (CTA before) -> {previous[1]}", [b[c] - a[c - 1] for c in b if c - 1 in a])
    return rows


def report(cases: dict, previous: tuple[str, str] | None = None, latest: int = 8) -> str:
    lines = []
    for case, per_label in cases.items():
        labels = order(per_label)
        lines.append(f"{case}: " + ", ".join(f"{k} {statistics.median(per_label[k].values()):.2f}" for k in labels)
                     + " us (medians over the CTAs that stamp)")
        for name, med, lo, hi in steps(per_label, previous):
            lines.append(f"  step {name}: median {med:+.2f}  min {lo:+.2f}  max {hi:+.2f}")
        last = per_label[labels[-1]]
        lines.append(f"  latest at {labels[-1]}: " + "; ".join(
            f"CTA {c} " + " ".join(f"{per_label[k].get(c, float('nan')):.2f}" for k in labels)
            for c in sorted(last, key=lambda c: -last[c])[:latest]))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    logs = [a for a in argv if not a.startswith("--")]
    option = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if a.startswith("--") and "=" in a}
    previous = tuple(option["--previous"].split(",")) if "--previous" in option else None
    latest, point = int(option.get("--latest", 8)), option.get("--point", "spare")
    if not logs:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    cases = defaultdict(dict)
    for path in logs:
        with open(path) as f:
            for case, per_label in runs(f.read(), point).items():
                cases[case].update(per_label)
    labels = sorted({k for per_label in cases.values() for k in per_label})
    if not labels:
        print(f"no 'every CTA, in order' line under a case header in {logs}: timeline_probe.py --by-cta logs?",
              file=sys.stderr)
        return 2
    if previous is not None and (len(previous) != 2 or not set(previous) <= set(labels)):
        print(f"--previous={','.join(previous)}: give two run labels A,B of {labels}", file=sys.stderr)
        return 2
    print(report(cases, previous, latest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
