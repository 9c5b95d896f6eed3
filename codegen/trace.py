"""Timelines of a launch: the ``tl`` stamps of a ``timeline=true`` build as a
Chrome/Perfetto trace and as a picture.

A timeline build keeps, per CTA, one timer value per timeline point of the
spec (``tl[BLOCKS, TL_POINTS]``, 0 where the CTA never reached the point: a
CTA with no task of a stage skips that stage's points). Reading them:

    tl stamps ──► slices(): per CTA, one slice between each two consecutive
                  reached points, named after the point that ends it
              ──► chrome_trace(): one track per CTA (open in ui.perfetto.dev)
              ──► plot_timeline(): CTAs on y, time on x, a colour per point

The pure functions take any [CTAs, points] integer array; ``run_timeline``
launches a build on the GPU with random inputs to get one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from statistics import median_low
from pathlib import Path
from typing import Any, Callable, Sequence

# Ticks of the targets' timer_now() (templates/targets/*): sm90 reads
# %globaltimer (nanoseconds), AMD reads s_memrealtime (a 100 MHz clock). sm90's stamps
# count the SM's cycles and reach tl as nanoseconds, placed between the CTA's
# %globaltimer reads at its start and end (templates/kernel.hip.j2: finer than
# %globaltimer's 32 ns steps within a CTA; the CTAs aligned to within one step). The stamps are
# ~1.8e18 ns: subtract them as integers (a double keeps only 256 ns steps of them).
TICK_NS = {"nvidia": 1.0, "amd": 10.0}


@dataclass(frozen=True)
class Slice:
    """CTA ``cta`` went from point ``begin`` to point ``name`` in
    [start_ns, start_ns + dur_ns), times from the launch's first stamp."""

    cta: int
    name: str
    begin: str
    start_ns: float
    dur_ns: float


def _rows(tl: Any, points: Sequence[str]) -> list[list[int]]:
    rows = tl.tolist() if hasattr(tl, "tolist") else [list(r) for r in tl]
    for i, row in enumerate(rows):
        if len(row) != len(points):
            raise ValueError(f"tl row {i} has {len(row)} stamps for {len(points)} timeline points {list(points)}")
    return rows


def slices(tl: Any, points: Sequence[str], tick_ns: float = 1.0) -> list[Slice]:
    """The slices of every CTA, in CTA order then time order. A stamp of 0 is
    a point the CTA did not reach; the reached ones are ordered by time (ties
    by their order in ``points``), so no slice is negative."""
    rows = _rows(tl, points)
    reached = [t for row in rows for t in row if t != 0]
    if not reached:
        return []
    origin = min(reached)
    out = []
    for cta, row in enumerate(rows):
        stamps = sorted((t, i) for i, t in enumerate(row) if t != 0)
        for (t0, i0), (t1, i1) in zip(stamps, stamps[1:]):
            out.append(Slice(cta, points[i1], points[i0], (t0 - origin) * tick_ns, (t1 - t0) * tick_ns))
    return out


def point_stats(samples: Sequence[Any], points: Sequence[str], tick_ns: float = 1.0) -> dict[str, tuple[float, float, float, int]]:
    """Per timeline point, over several launches' stamps (each [CTAs, points], 0: not reached):
    (min, median, max) over the CTAs that stamped it, in microseconds after that launch's first
    CTA start (points[0] is the spec's start), each the median over the launches; and how many
    CTAs stamped it in the last launch. A single launch's figures move by about 1 us from one
    launch to the next (bench/NOTES.md, DeepSeek session 12). Medians are the lower middle value
    (as torch.median); the stamps are subtracted as integers (TICK_NS)."""
    launches = []  # (its rows, its first CTA's start)
    for tl in samples:
        rows = _rows(tl, points)
        starts = [row[0] for row in rows if row[0] != 0]
        if starts:
            launches.append((rows, min(starts)))
    out = {}
    for p, name in enumerate(points):
        per_launch = []
        for rows, t0 in launches:
            v = sorted((row[p] - t0) * tick_ns / 1e3 for row in rows if row[p] != 0)
            if v:
                per_launch.append((v[0], median_low(v), v[-1], len(v)))
        if per_launch:
            out[name] = (median_low([x[0] for x in per_launch]), median_low([x[1] for x in per_launch]),
                         median_low([x[2] for x in per_launch]), per_launch[-1][3])
    return out


def chrome_trace(tl: Any, points: Sequence[str], tick_ns: float = 1.0, title: str = "mono kernel") -> dict:
    """A Chrome trace-event JSON object (Perfetto reads it): one process named
    ``title``, one thread (track) per CTA named ``CTA <b>``, one complete
    event (``ph: X``) per slice, times in microseconds."""
    rows = _rows(tl, points)
    events: list[dict] = [{"ph": "M", "pid": 0, "tid": 0, "name": "process_name", "args": {"name": title}}]
    for cta in range(len(rows)):
        events.append({"ph": "M", "pid": 0, "tid": cta, "name": "thread_name", "args": {"name": f"CTA {cta}"}})
        events.append({"ph": "M", "pid": 0, "tid": cta, "name": "thread_sort_index", "args": {"sort_index": cta}})
    for s in slices(rows, points, tick_ns):
        events.append({
            "ph": "X", "pid": 0, "tid": s.cta, "name": s.name, "cat": "timeline",
            "ts": s.start_ns / 1000.0, "dur": s.dur_ns / 1000.0,
            "args": {"from": s.begin, "to": s.name, "dur_ns": s.dur_ns},
        })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"kernel": title, "timeline_points": list(points), "tick_ns": tick_ns, "ctas": len(rows)},
    }


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend; a clear error when
    matplotlib is missing (it is in the ``dev`` extra)."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("the picture needs matplotlib: pip install matplotlib (or pip install -e '.[dev]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def point_colors(points: Sequence[str]) -> dict[str, Any]:
    """One colour per timeline point, stable for a spec (its order in ``points``)."""
    plt = pyplot()
    cmap = plt.get_cmap("tab10" if len(points) <= 10 else "tab20")
    return {p: cmap(i % cmap.N) for i, p in enumerate(points)}


def plot_timeline(tl: Any, points: Sequence[str], path: str | Path, tick_ns: float = 1.0,
                  title: str = "mono kernel") -> Path:
    """A PNG of the slices: one row per CTA (CTA 0 on top), time in
    microseconds on x, each slice coloured by the point that ends it."""
    plt = pyplot()
    rows = _rows(tl, points)
    ss = slices(rows, points, tick_ns)
    colors = point_colors(points)
    n = max(len(rows), 1)
    fig, ax = plt.subplots(figsize=(12, min(40.0, 2.0 + 0.06 * n)))
    by_name: dict[str, list[tuple[int, float, float]]] = {}
    for s in ss:
        by_name.setdefault(s.name, []).append((s.cta, s.start_ns / 1000.0, s.dur_ns / 1000.0))
    for name in points:  # one bar collection per point, legend in spec order
        if name in by_name:
            cta, x, w = zip(*by_name[name])
            ax.barh(cta, w, left=x, height=0.9, color=colors[name], linewidth=0, label=f"... {name}")
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel("time from the first stamp (us)")
    ax.set_ylabel("CTA")
    ax.set_title(title)
    if by_name:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", title="slice ends at")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def timeline_arg(ir) -> str:
    """The ABI argument that receives the stamps (workspace ``timeline``)."""
    for a in ir.abi:
        if a.workspace == "timeline":
            return a.name
    raise ValueError(f"{ir.kernel}: no ABI argument with workspace: timeline to receive the stamps")


def run_timeline(name: str, tokens: int = 1, target: str | None = None, seed: int = 0, warmup: int = 1,
                 make_args: Callable | None = None, dims: dict[str, int] | None = None, **flags) -> tuple[Any, Any]:
    """Launch build ``tokens``, ``flags`` of spec ``name`` with ``timeline=true``
    on the GPU, ``warmup`` times and then once more for the stamps. The
    arguments come from ``make_args(kernel, seed)`` (workspace buffers it
    leaves out are added), else ``codegen.inputs.random_args`` (runtime
    dimensions from ``dims``). Returns ``(kernel, tl)``, ``tl`` on the CPU.
    RuntimeError where torch sees no GPU."""
    import torch

    from .inputs import random_args
    from .launch import load
    from .spec import load_spec

    if "timeline" not in load_spec(name).spec.params:
        raise ValueError(f"spec {name!r} has no 'timeline' build parameter: nothing stamps its progress")
    if not torch.cuda.is_available():
        raise RuntimeError("trace launches the kernel and needs a GPU, and torch sees none; "
                           "on a machine without one, use rolemap (task placement) and report (resources)")
    kernel = load(name, tokens=tokens, target=target, **{**flags, "timeline": True})
    if make_args is not None:
        args = {**kernel.workspace("cuda"), **make_args(kernel, seed)}
    else:
        args = random_args(kernel, seed=seed, device="cuda", dims=dims)
    tl_name = timeline_arg(kernel.ir)
    if args.get(tl_name) is None:
        args[tl_name] = kernel.workspace("cuda")[tl_name]
    tl = args[tl_name]
    for _ in range(warmup):
        kernel(**args)
    tl.zero_()
    kernel(**args)
    torch.cuda.synchronize()
    return kernel, tl.cpu()


def trace(name: str, out: str | Path, tokens: int = 1, target: str | None = None, seed: int = 0,
          png: bool = True, make_args: Callable | None = None, dims: dict[str, int] | None = None,
          **flags) -> list[Path]:
    """``run_timeline``, then ``<out>.json`` (Chrome/Perfetto) and
    ``<out>.png``. Returns the files written."""
    kernel, tl = run_timeline(name, tokens=tokens, target=target, seed=seed, make_args=make_args, dims=dims,
                              **flags)
    ir = kernel.ir
    tick = TICK_NS[ir.target.vendor]
    from .rolemap import short_label

    title = f"{ir.kernel} {ir.target.name} {short_label(ir)}"
    out = Path(out)
    json_path = out.with_name(out.name + ".json")
    json_path.write_text(json.dumps(chrome_trace(tl, ir.timeline_points, tick, title)))
    written = [json_path]
    if png:
        written.append(plot_timeline(tl, ir.timeline_points, out.with_name(out.name + ".png"), tick, title))
    return written
