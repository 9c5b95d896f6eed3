"""Which CTA runs which task of which stage, for one build: the task tables of
the lowering (``KernelIR.stages``) as a table and as a picture. No GPU.

A stage's task t runs on CTA ``first + t % ctas`` (round robin; a fixed range
has ``tasks <= ctas``, so the same formula gives ``first + t``), and every CTA
runs its tasks stage by stage in spec order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .lower import KernelIR

IDLE_COLOR = "#d9d9d9"


@dataclass(frozen=True)
class Role:
    """CTA's share of one stage: the stage, its kind, its task numbers."""

    stage: str
    kind: str
    tasks: tuple[int, ...]


def role_table(ir: KernelIR) -> list[tuple[Role, ...]]:
    """Per CTA (index = CTA), its roles in the order it runs them; an empty
    tuple for a CTA with no task in this build."""
    table: list[list[Role]] = [[] for _ in range(ir.blocks)]
    for s in ir.stages:
        per_cta: dict[int, list[int]] = {}
        for t in range(s.tasks):
            per_cta.setdefault(s.first + t % s.ctas, []).append(t)
        for cta, tasks in sorted(per_cta.items()):
            table[cta].append(Role(s.name, s.kind, tuple(tasks)))
    return [tuple(roles) for roles in table]


def _ranges(ctas: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0..2, 5``."""
    out, start = [], None
    for i, c in enumerate(ctas):
        if start is None:
            start = c
        if i + 1 == len(ctas) or ctas[i + 1] != c + 1:
            out.append(f"{start}" if start == c else f"{start}..{c}")
            start = None
    return ", ".join(out) or "none"


def _stage_counts(ir: KernelIR, table: list[tuple[Role, ...]]) -> dict[str, dict[int, int]]:
    """Per stage: CTA -> how many of its tasks that CTA runs."""
    counts: dict[str, dict[int, int]] = {s.name: {} for s in ir.stages}
    for cta, roles in enumerate(table):
        for r in roles:
            counts[r.stage][cta] = len(r.tasks)
    return counts


def _per_cta(counts: dict[int, int]) -> str:
    per = sorted(set(counts.values()))
    return str(per[0]) if len(per) == 1 else f"{per[0]}-{per[-1]}"


def summary(ir: KernelIR) -> list[str]:
    """One line per stage (CTAs used, tasks per CTA), then the idle CTAs."""
    table = role_table(ir)
    counts = _stage_counts(ir, table)
    lines = []
    for s in ir.stages:
        c = counts[s.name]
        lines.append(f"{s.index}. {s.name} ({s.kind}): {s.tasks} tasks on CTAs {_ranges(sorted(c))}, "
                     f"{_per_cta(c)} per CTA")
    idle = [cta for cta, roles in enumerate(table) if not roles]
    lines.append(f"idle: {len(idle)} CTAs ({_ranges(idle)})")
    return lines


def short_label(ir) -> str:
    """The build as ``generated/`` names it (``s16``, ``s4-timeline``)."""
    from .generate import build_label
    from .spec import load_spec

    return build_label(load_spec(ir.kernel), ir.build)


def plot_rolemap(ir: KernelIR, path: str | Path) -> Path:
    """A PNG: one row per stage (and one for idle CTAs), one column per CTA;
    a cell is coloured where the CTA runs tasks of the stage, darker for more
    tasks (the count is written in where it fits)."""
    from .trace import pyplot

    plt = pyplot()
    table = role_table(ir)
    cmap = plt.get_cmap("tab10")
    n_rows = len(ir.stages) + 1
    fig, ax = plt.subplots(figsize=(min(24.0, 4.0 + 0.08 * ir.blocks), 1.2 + 0.6 * n_rows))
    labels = []
    counts = _stage_counts(ir, table)
    for row, s in enumerate(ir.stages):
        color = cmap(row % cmap.N)
        c = counts[s.name]
        most = max(c.values())
        ctas = sorted(c)
        shades = [(*color[:3], 0.45 + 0.55 * c[cta] / most) for cta in ctas]
        ax.bar(ctas, 0.8, width=1.0, bottom=row - 0.4, color=shades, edgecolor="white", linewidth=0.3)
        if ir.blocks <= 64 and most > 1:
            for cta in ctas:
                ax.text(cta, row, str(c[cta]), ha="center", va="center", fontsize=7)
        labels.append(f"{s.name} ({s.kind})\n{s.tasks} tasks, {_per_cta(c)} per CTA")
    idle = [cta for cta, roles in enumerate(table) if not roles]
    if idle:
        ax.bar(idle, 0.8, width=1.0, bottom=n_rows - 1 - 0.4, color=IDLE_COLOR, edgecolor="white", linewidth=0.3)
    labels.append(f"idle\n{len(idle)} CTAs")
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_xlim(-0.5, ir.blocks - 0.5)
    ax.set_xlabel("CTA")
    ax.set_title(f"{ir.kernel} on {ir.target.name}, build {short_label(ir)}: {ir.blocks} CTAs x {ir.threads} threads")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
