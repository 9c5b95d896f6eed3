"""What a reviewer reads besides the generated files: unified diffs of the
generated source (between two builds, two targets, or the working tree and a
git revision) and the resource report with co-residency (how many CTAs of a
build fit on one CU/SM at once, and whether the whole grid does).

The mono kernels' CTAs poll each other's mailboxes, so every CTA of the grid
must be resident at once: ``co_residency`` is the compile-time estimate of
what ``codegen.launch`` checks at run time with the driver's occupancy query."""

from __future__ import annotations

import difflib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .generate import ROOT, build_label, review_builds
from .jit.offline import NV_REG_GRANULE
from .lower import lower, make_build
from .render import render
from .spec import load_spec
from .targets import Target, get_target

# ---- co-residency: per-CU/SM budgets of each target ----------------------------------
AMD_SIMDS_PER_CU = 4  # CDNA3/CDNA4: a workgroup's waves are spread over the CU's 4 SIMDs
LDS_PER_CU = {  # shared by the CTAs resident on one CU/SM
    "gfx942": 64 * 1024,  # MI300X: 64 KiB LDS per CU
    "gfx950": 160 * 1024,  # MI355X: 160 KiB LDS per CU
    "sm90": 228 * 1024,  # H100/H200: 228 KiB shared memory per SM (227 KiB usable by one CTA)
}
NV_REGS_PER_SM = 65536  # Hopper register file, 32-bit registers per SM
NV_THREADS_PER_SM = 2048  # 64 warps per SM
NV_MAX_CTAS_PER_SM = 32
NV_SMEM_RESERVED_PER_CTA = 1024  # the driver reserves 1 KiB per CTA (CUDA occupancy calculator)


@dataclass(frozen=True)
class CoResidency:
    """CTAs of one build that fit on one CU/SM at once, and what limits them."""

    per_cu: int
    limiter: str  # the tightest of ``limits`` ("registers", "lds", "threads", "ctas")
    limits: dict  # CTAs per CU/SM allowed by each resource alone

    def grid_fits(self, blocks: int, compute_units: int) -> bool:
        return self.per_cu * compute_units >= blocks


def co_residency(target: Target | str, threads: int, regs: int, waves_per_simd: int, lds_bytes: int) -> CoResidency:
    """CTAs of ``threads`` threads that fit per CU (AMD) or SM (NVIDIA).

    AMD: ``waves_per_simd`` (the report's occupancy from VGPRs) x 4 SIMDs
    over the CTA's waves, and the CU's LDS over the CTA's. sm90: 65536
    registers per SM over the CTA's (``regs`` per thread rounded up to 8),
    228 KiB of shared memory over the CTA's plus the 1 KiB the driver keeps
    per CTA, 2048 threads per SM, at most 32 CTAs."""
    t = get_target(target) if isinstance(target, str) else target
    waves = -(-threads // t.wave_size)
    limits: dict[str, int] = {}
    if t.vendor == "amd":
        limits["registers"] = waves_per_simd * AMD_SIMDS_PER_CU // waves
        if lds_bytes:
            limits["lds"] = LDS_PER_CU[t.name] // lds_bytes
    else:
        alloc = max(NV_REG_GRANULE, -(-regs // NV_REG_GRANULE) * NV_REG_GRANULE)
        limits["registers"] = NV_REGS_PER_SM // (alloc * waves * t.wave_size)
        limits["lds"] = LDS_PER_CU[t.name] // (lds_bytes + NV_SMEM_RESERVED_PER_CTA)
        limits["threads"] = NV_THREADS_PER_SM // threads
        limits["ctas"] = NV_MAX_CTAS_PER_SM
    limiter = min(limits, key=limits.get)
    return CoResidency(limits[limiter], limiter, limits)


def report_rows(names: list[str] | None = None, target: str | None = None) -> list[dict]:
    """One row per kernel of every review build (of ``names``, on ``target``):
    the compiler's resource report with no GPU, the LDS and mailbox bytes of
    the IR, and the co-residency of the build."""
    from . import jit

    rows = []
    for rb in review_builds(names):
        if target and rb.target != target:
            continue
        ir = lower(load_spec(rb.spec), rb.build)
        for rep in jit.resource_report(render(ir), rb.path.name, ir.target):
            lds = max(rep.lds_bytes, ir.lds_bytes)  # NVIDIA's is dynamic: not in ptxas' count
            co = co_residency(ir.target, ir.threads, rep.vgprs, rep.occupancy_waves_per_simd, lds)
            rows.append({
                "build": rb.path.name, "target": rb.target, "kernel": rep.name, "vgprs": rep.vgprs,
                "agprs": rep.agprs, "sgprs": rep.sgprs, "lds_bytes": ir.lds_bytes,
                "scratch_bytes": rep.scratch_bytes, "spills": rep.spills, "mma": rep.mfma,
                "mailbox_bytes": ir.scratch_bytes, "threads": ir.threads, "blocks": ir.blocks,
                "waves_per_simd": rep.occupancy_waves_per_simd, "ctas_per_cu": co.per_cu,
                "co_residency_limiter": co.limiter, "co_residency_limits": co.limits,
                "co_resident_ctas": co.per_cu * ir.target.compute_units,
                "grid_fits": co.grid_fits(ir.blocks, ir.target.compute_units),
            })
    return rows


def format_report(rows: list[dict]) -> str:
    """The report as a table; ``CTAs/CU`` is what fits at once, by its limiter."""
    head = (f"{'build':28s} {'regs':>4s} {'sgpr':>4s} {'LDS':>7s} {'spill':>5s} {'stack':>5s} "
            f"{'CTAs/CU':>13s} {'grid':>13s} {'mailbox':>8s}  MMA opcodes")
    lines = [head]
    for r in rows:
        mma = ", ".join(f"{k} x{v}" for k, v in sorted(r["mma"].items()))
        co = f"{r['ctas_per_cu']} {r['co_residency_limiter']}"
        grid = f"{r['blocks']}/{r['co_resident_ctas']} {'ok' if r['grid_fits'] else 'NO'}"
        lines.append(f"{r['build']:28s} {r['vgprs']:4d} {r['sgprs'] or 0:4d} {r['lds_bytes']:7d} {r['spills']:5d} "
                     f"{r['scratch_bytes']:5d} {co:>13s} {grid:>13s} {r['mailbox_bytes']:8d}  {mma}")
    return "\n".join(lines) + "\n"


# ---- diffs -----------------------------------------------------------------------------


def unified(a: str, b: str, a_name: str, b_name: str, context: int = 3) -> str:
    """``diff -u`` of two texts ('' when equal)."""
    lines = difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True), a_name, b_name, n=context)
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _build_file(spec: str, target: str, params: dict) -> tuple[str, str]:
    """(file name as generate would call it, rendered source) of one build."""
    loaded = load_spec(spec)
    build = make_build(loaded, target, **params)
    return f"{spec}.{target}.{build_label(loaded, build)}.hip", render(lower(loaded, build))


def diff_builds(spec: str, a: dict, b: dict, target_a: str = "sm90", target_b: str | None = None,
                context: int = 3) -> str:
    """Unified diff of the source of build ``a`` on ``target_a`` against build
    ``b`` on ``target_b`` (default: the same target)."""
    name_a, text_a = _build_file(spec, target_a, a)
    name_b, text_b = _build_file(spec, target_b or target_a, b)
    return unified(text_a, text_b, f"a/{name_a}", f"b/{name_b}", context)


@dataclass(frozen=True)
class FileChange:
    status: str  # "M" changed, "A" new, "D" no build produces it any more
    path: str  # relative to the repository root: generated/<model>/<kernel>.<target>.<build>.hip
    stale: bool = False  # the working tree's generated/ file differs from the rendering


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    except OSError as e:
        raise ValueError(f"cannot run git: {e}") from None


def _at_rev(root: Path, rev: str, path: str) -> str | None:
    out = _git(root, "show", f"{rev}:./{path}")
    return out.stdout if out.returncode == 0 else None


def diff_rev(rev: str, names: list[str] | None = None, root: Path = ROOT, context: int = 3) -> tuple[str, list[FileChange]]:
    """Every review build rendered from the working tree, diffed against
    ``generated/`` at git revision ``rev`` (read with ``git show``; nothing in
    the repository changes). Returns the diff and the files that changed,
    including those ``rev`` has and no build produces any more."""
    if _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode != 0:
        raise ValueError(f"{rev!r} is not a git revision of {root}")
    listed = _git(root, "ls-tree", "-r", "--name-only", rev, "--", "generated")
    at_rev = set(listed.stdout.split()) if listed.returncode == 0 else set()
    chunks, changes, produced = [], [], set()
    for rb in review_builds(names):
        rel = rb.path.relative_to(ROOT).as_posix()
        produced.add(rel)
        text = render(lower(load_spec(rb.spec), rb.build))
        on_disk = root / rel
        stale = not on_disk.exists() or on_disk.read_text() != text
        old = _at_rev(root, rev, rel) if rel in at_rev else None
        if old == text:
            continue
        chunks.append(unified(old or "", text, f"a/{rel}" if old is not None else "/dev/null", f"b/{rel}", context))
        changes.append(FileChange("A" if old is None else "M", rel, stale))
    prefixes = tuple(f"generated/{n}." for n in names) if names else ("generated/",)
    for rel in sorted(at_rev - produced):
        if rel.endswith(".hip") and rel.startswith(prefixes):
            chunks.append(unified(_at_rev(root, rev, rel) or "", "", f"a/{rel}", "/dev/null", context))
            changes.append(FileChange("D", rel, (root / rel).exists()))
    return "".join(chunks), changes


def format_changes(rev: str, changes: list[FileChange]) -> str:
    """The summary of ``diff_rev``: one line per changed file, stale ones marked."""
    if not changes:
        return f"generated source unchanged since {rev}\n"
    lines = [f"generated files changed since {rev}:"]
    for c in changes:
        note = "  (generated/ is stale: run make generate)" if c.stale else ""
        lines.append(f"  {c.status} {c.path}{note}")
    return "\n".join(lines) + "\n"

