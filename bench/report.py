"""Reporting: the console table, the markdown entry for bench/RESULTS.md, the
JSON of all numbers and the plot (matplotlib optional)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench import targets

COLUMNS = ("S", "ours us", "eager us", "compile us", "floor us", "ours/floor", "compile/ours")
CONTEXT_COLUMN = "context"  # inserted after S when any row has a context


def _f(v, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def context_label(ctx) -> str:
    """4096 -> 4K, 65536 -> 64K; other lengths as they are."""
    if ctx is None:
        return "-"
    return f"{ctx // 1024}K" if ctx % 1024 == 0 else str(ctx)


def _has_context(rows: list[dict]) -> bool:
    return any(r.get("context") is not None for r in rows)


def columns(rows: list[dict]) -> tuple[str, ...]:
    return COLUMNS[:1] + (CONTEXT_COLUMN,) + COLUMNS[1:] if _has_context(rows) else COLUMNS


def table_rows(rows: list[dict]) -> list[list[str]]:
    """One list of cells per case row (see ``columns``)."""
    ctx = _has_context(rows)
    out = []
    for r in rows:
        cells = [str(r["tokens"])] + ([context_label(r.get("context"))] if ctx else [])
        out.append(cells + [
            _f(r.get("ours_us")), _f(r.get("eager_us")), _f(r.get("compile_us")), _f(r.get("floor_us")),
            _f(targets.ratio(r, "ours/floor")), _f(targets.ratio(r, "compile/ours")),
        ])
    return out


def format_table(rows: list[dict]) -> str:
    cols = columns(rows)
    cells = [list(cols)] + table_rows(rows)
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    cols = columns(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(rows)]
    return "\n".join(lines)


def markdown_entry(meta: dict, rows: list[dict], extras: dict) -> str:
    """The section appended to bench/RESULTS.md for one run."""
    fake = " (DRY RUN: fake numbers)" if meta.get("dry_run") else ""
    bw = extras.get("copy_bandwidth", {})
    build = f" ({meta['build']})" if meta.get("build") else ""
    floor = f" {meta['floor_note'][0].upper()}{meta['floor_note'][1:]}." if meta.get("floor_note") else ""
    lines = [
        f"## {meta['kernel']}{build} on {meta['gpu']}, {meta['date']}{fake}",
        "",
        f"commit `{meta['commit']}`, torch {meta['torch']}, CUDA {meta.get('cuda') or 'n/a'}, "
        f"target {meta['target']}; {meta['copies']} weight copies per graph "
        f"(L2 {meta['l2_bytes'] / 2**20:.0f} MiB), {meta['replays']} replays (median); "
        f"unfused GEMM: {meta['gemm']}; copy bandwidth {bw.get('bytes_per_s', 0) / 1e12:.2f} TB/s "
        f"(read + written).{floor}",
        "",
        markdown_table(rows),
        "",
    ]
    notes = list(meta.get("notes", []))
    verdict = targets_note(meta, rows, extras)
    if verdict:
        notes.insert(0, verdict)
    for key, label in (("jit", "JIT"), ("generate", "make generate")):
        if key in extras:
            notes.append(f"{label}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in extras[key].items() if not k.endswith("stderr")))
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def targets_note(meta: dict, rows: list[dict], extras: dict) -> str | None:
    """Issue 5's targets judged on this run (``bench.targets``), one line: how many are met,
    then the unmet, the unmeasured and the met, each group by target, its cases with their
    values; None when no target applies (e.g. MiniMax without the issue's contexts)."""
    verdicts = targets.judge(meta, rows, extras)
    if not verdicts:
        return None
    gpu = meta.get("gpu") or "?"
    where = "" if targets.TARGET_GPU in gpu else "; this run's GPU is not one, so its ratios are not the targets' own"
    groups = []
    for title, keep in (("unmet", lambda v: v.value is not None and not v.met),
                        ("not measured", lambda v: v.value is None), ("met", lambda v: v.met)):
        chosen = [v for v in verdicts if keep(v)]
        by_target: dict[tuple, list] = {}
        for v in chosen:
            by_target.setdefault((v.label, v.bound, v.at_most), []).append(v)
        parts = []
        for (label, bound, at_most), vs in by_target.items():
            cases = ", ".join(" ".join(filter(None, (_case_label(v), _verdict_value(v)))) for v in vs)
            parts.append(f"{label} {'<=' if at_most else '>='} {bound:g}: {cases}")
        if parts:
            groups.append(f"{title}: " + "; ".join(parts))
    met = sum(v.met for v in verdicts)
    return (f"issue 5 targets (set on an {targets.TARGET_GPU}{where}): {met} of {len(verdicts)} met. "
            + ". ".join(g[0].upper() + g[1:] for g in groups))


def _case_label(v) -> str:
    if v.tokens is None:
        return ""
    return f"S={v.tokens}" + (f" {context_label(v.context)}" if v.context is not None else "")


def _verdict_value(v) -> str:
    if v.value is None:
        return "n/a"
    return f"{v.value:.3f}" if v.value < 0.1 else f"{v.value:.2f}"


def append_results(path: Path, entry: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = "" if path.exists() else (
        "# Benchmark results\n\nAppended by `make bench` (`python -m bench.run`); method in "
        "bench/NOTES.md. Times are per call, us.\n\n")
    with open(path, "a") as f:
        f.write(head + entry + "\n")


def write_json(path: Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def plot_title(meta: dict) -> str:
    build = f" ({meta['build']})" if meta.get("build") else ""
    return f"{meta['kernel']}{build} on {meta['gpu']} ({meta['commit']})"


def plot(rows: list[dict], path: Path, title: str) -> str | None:
    """us vs S, one line per contender and the floor, to ``path`` (PNG); one
    panel per context when the rows have several. Returns None, or why no
    plot was written (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as e:
        return f"no plot: matplotlib is not installed ({e}); later: python -m bench.plot bench.json"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    contexts = list(dict.fromkeys(r.get("context") for r in rows)) or [None]
    fig, axes = plt.subplots(1, len(contexts), figsize=(6.4 * len(contexts), 4.2), dpi=120, squeeze=False)
    for ax, ctx in zip(axes[0], contexts):
        sub = [r for r in rows if r.get("context") == ctx]
        xs = [r["tokens"] for r in sub]
        for key, label, style in (("ours_us", "ours (mono kernel)", "o-"), ("eager_us", "eager unfused", "s-"),
                                  ("compile_us", "torch.compile unfused", "^-"),
                                  ("floor_us", "streaming floor", "k--")):
            pts = [(x, r.get(key)) for x, r in zip(xs, sub) if r.get(key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
        ax.set_xlabel("tokens S")
        ax.set_ylabel("us per call (cold weights, CUDA graph)")
        ax.set_title(title + ("" if ctx is None else f", context {context_label(ctx)}"), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
