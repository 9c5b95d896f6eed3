"""Issue 5's targets, judged on one bench run: the ratio bounds the issue sets for each kernel's
cases (ours against the streaming floor, torch.compile against ours) and the JIT's and
``make generate``'s times. The issue sets them on an H200, ratios from one run; a run on
another GPU is judged the same way but says so (its floor differs, so its ratios are not the
targets' own). ``bench.report`` writes the verdict into each RESULTS entry."""

from __future__ import annotations

from dataclasses import dataclass

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
    """A case row's ``metric`` ("ours/floor" or "compile/ours"), None where a time is missing."""
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
