"""Issue 5's targets, judged on one bench run: the ratio bounds the issue sets for each kernel's
cases (ours against the streaming floor, torch.compile against ours) and the JIT's and
``make generate``'s times. The issue sets them on an H200, ratios from one run; a run on
another GPU is judged the same way but says so (its floor differs, so its ratios are not the
targets' own). ``bench.report`` writes the verdict into each RESULTS entry;

    python -m bench.targets [bench/RESULTS.md] [--all]

judges the entries already there: the latest of each kernel on each GPU (``--all``: every
entry), from their tables and JIT / make generate notes."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

TARGET_GPU = "H200"


@dataclass(frozen=True)
class RatioTarget:
    """A bound on a case's ratio: ``metric`` "ours/floor" (at most ``bound``) or
    "compile/ours" (at least ``bound``), for the cases whose S is in ``tokens`` (None: all)."""

    metric: str
    bound: float
    tokens: frozenset[int] | None = None

    @property
    def at_most(self) -> bool:
        return self.metric == "ours/floor"


@dataclass(frozen=True)
class TimeTarget:
    """A bound on a time the run measures: ``extras[group][key]`` in seconds, at most ``bound``."""

    group: str
    key: str
    bound: float
    label: str


@dataclass(frozen=True)
class Verdict:
    """One target on one case (``tokens`` / ``context``; None for a time target)."""

    label: str
    value: float | None  # None: not measured in this run (e.g. --no-compile)
    bound: float
    at_most: bool
    tokens: int | None = None
    context: int | None = None

    @property
    def met(self) -> bool:
        if self.value is None:
            return False
        return self.value <= self.bound if self.at_most else self.value >= self.bound


# The issue's cases: MiniMax at the 4K and 64K contexts (a row without a context, the GPU
# tests' launch, is none of them); DeepSeek at TP4 (the bench's build label starts "TP4").
RATIO_TARGETS: dict[str, tuple[RatioTarget, ...]] = {
    "minimax_m3/pre_attn": (
        RatioTarget("ours/floor", 1.3, frozenset({1})),
        RatioTarget("ours/floor", 1.6, frozenset({16})),
        RatioTarget("compile/ours", 10.0),
    ),
    "deepseek_v41/attn_front": (
        RatioTarget("ours/floor", 1.4, frozenset(range(1, 17))),
        RatioTarget("ours/floor", 2.0, frozenset({48})),
        RatioTarget("compile/ours", 8.0),
    ),
}
TIME_TARGETS = (
    TimeTarget("jit", "cold_compile_s", 2.0, "JIT cold compile s"),
    TimeTarget("jit", "warm_cache_s", 0.05, "JIT warm cache load s"),
    TimeTarget("generate", "wall_s", 10.0, "make generate s"),
)


def ratio(row: dict, metric: str) -> float | None:
    """A case row's ``metric`` ("ours/floor" or "compile/ours"): the row's own (a RESULTS table's
    column, from the unrounded times), else from its times; None where a time is missing."""
    if row.get(metric) is not None:
        return row[metric]
    top, bottom = {"ours/floor": ("ours_us", "floor_us"), "compile/ours": ("compile_us", "ours_us")}[metric]
    a, b = row.get(top), row.get(bottom)
    return a / b if a and b else None


def issue_case(meta: dict, row: dict) -> bool:
    """Whether a row is one of the cases the issue sets targets for."""
    if meta["kernel"] == "minimax_m3/pre_attn":
        return row.get("context") is not None
    return (meta.get("build") or "").startswith("TP4")


def judge(meta: dict, rows: list[dict], extras: dict) -> list[Verdict]:
    """Every target that applies to this run, judged: the ratio targets on the issue's cases
    among ``rows``, then the time targets ``extras`` has a measurement for."""
    out = []
    for target in RATIO_TARGETS.get(meta["kernel"], ()):
        for row in rows:
            if issue_case(meta, row) and (target.tokens is None or row["tokens"] in target.tokens):
                out.append(Verdict(target.metric, ratio(row, target.metric), target.bound, target.at_most,
                                   row["tokens"], row.get("context")))
    for target in TIME_TARGETS:
        value = extras.get(target.group, {}).get(target.key)
        if isinstance(value, (int, float)):
            out.append(Verdict(target.label, float(value), target.bound, True))
    return out


ENTRY = re.compile(r"^## (?P<kernel>\S+)(?: \((?P<build>.*)\))? on (?P<gpu>[^,]+), "
                   r"(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d UTC)(?P<dry> \(DRY RUN.*)?$")
# a RESULTS table's columns -> a case row's keys (bench.report.COLUMNS)
TABLE_KEYS = {"S": "tokens", "context": "context", "ours us": "ours_us", "compile us": "compile_us",
              "floor us": "floor_us", "ours/floor": "ours/floor", "compile/ours": "compile/ours"}


def _cell(key: str, text: str):
    if text in ("n/a", "-"):
        return None
    if key == "tokens":
        return int(text)
    if key == "context":
        return int(text[:-1]) * 1024 if text.endswith("K") else int(text)
    return float(text)


def _timings(note: str) -> dict:
    """A RESULTS note's "name value, name value" timings (JIT, make generate) as numbers."""
    out = {}
    for part in note.split(", "):
        name, _, value = part.partition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def results_entries(text: str) -> list[tuple[dict, list[dict], dict]]:
    """Each entry of a RESULTS.md, oldest first, as judge's (meta, rows, extras); dry runs left out."""
    entries: list[tuple[dict, list[dict], dict]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        m = ENTRY.match(line)
        if m:
            header = None
            if m["dry"]:
                entries.append(None)  # its lines follow: read, then dropped
            else:
                entries.append(({"kernel": m["kernel"], "build": m["build"] or "", "gpu": m["gpu"],
                                 "date": m["date"]}, [], {}))
            continue
        if not entries or entries[-1] is None:
            continue
        meta, rows, extras = entries[-1]
        if line.startswith("commit `"):
            meta["commit"] = line[len("commit `"):].split("`")[0]
        elif line.startswith("| S |"):
            header = [c.strip() for c in line.strip("|").split("|")]
        elif line.startswith("|") and header and not line.startswith("|-"):  # a row, not the rule under the header
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.append({TABLE_KEYS[h]: _cell(TABLE_KEYS[h], c) for h, c in zip(header, cells) if h in TABLE_KEYS})
        elif line.startswith("- JIT: "):
            extras["jit"] = _timings(line[len("- JIT: "):])
        elif line.startswith("- make generate: "):
            extras["generate"] = _timings(line[len("- make generate: "):])
    return [e for e in entries if e is not None]


def main(argv=None) -> int:
    from bench import report

    ap = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=str(Path(__file__).with_name("RESULTS.md")))
    ap.add_argument("--all", action="store_true", help="every entry, not only the latest of each kernel and GPU")
    args = ap.parse_args(argv)
    entries = results_entries(Path(args.results).read_text())
    if not args.all:
        latest = {(meta["kernel"], meta["gpu"]): (meta, rows, extras) for meta, rows, extras in entries}
        entries = list(latest.values())
    for meta, rows, extras in entries:
        build = f" ({meta['build']})" if meta["build"] else ""
        print(f"{meta['kernel']}{build} on {meta['gpu']}, {meta['date']}, commit {meta.get('commit', '?')[:10]}:")
        print("  " + (report.targets_note(meta, rows, extras) or "no target applies"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
