"""Compile checks with no GPU and no ROCm: what a kernel costs in registers,
LDS/shared memory, scratch and spills, and which matrix instructions it uses.

* AMD: clang 22 from the PyPI package ``ziglang`` compiles the HIP source for
  the target's ``--offload-arch`` to assembly; the AMDGPU metadata block
  (``amdhsa.kernels``) gives the resources of each kernel, and the ``v_mfma_*``
  mnemonics in each kernel's body are counted.
* NVIDIA: nvrtc compiles to a CUBIN with ``--ptxas-options=-v``; ptxas' report in
  the program log gives registers, stack, spills and shared memory, and the PTX
  of the same program gives the ``mma`` / ``wgmma`` instructions.

Results go through the disk cache (as JSON)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import cache
from .errors import BackendUnavailable, CompileError

# The clang options of the AMD check: the device half only, no ROCm headers or
# device libraries (sources bring their own small prelude), assembly out.
CLANG_OPTIONS: tuple[str, ...] = (
    "-x",
    "hip",
    "-nogpulib",
    "-nogpuinc",
    "--cuda-device-only",
    "-O3",
    "-ffp-contract=off",
    "-std=c++17",
    "-S",
)
CLANG_TIMEOUT_S = 600

# Unified VGPR file of gfx90a and later: 512 registers per SIMD lane, allocated
# in granules of 8, at most 8 waves per SIMD.
AMD_VGPRS_PER_SIMD = 512
AMD_VGPR_GRANULE = 8
AMD_MAX_WAVES_PER_SIMD = 8
# Hopper: 16384 registers per SM sub-partition = 512 per lane of a warp,
# allocated per thread in granules of 8, at most 16 warps per sub-partition.
NV_REGS_PER_LANE = 512
NV_REG_GRANULE = 8
NV_MAX_WARPS_PER_SCHEDULER = 16


@dataclass
class ResourceReport:
    """What one kernel uses, from the compiler's own report.

    On NVIDIA ``vgprs`` is registers per thread, ``sgprs``/``agprs`` are 0,
    ``scratch_bytes`` is the stack frame, and ``vgpr_spills`` is the spill
    stores in 4-byte registers (the bytes are in ``spill_store_bytes`` and
    ``spill_load_bytes``). ``mfma`` counts the matrix instructions by full
    mnemonic (``v_mfma_*`` on AMD, ``mma.sync...`` / ``wgmma...`` on NVIDIA).
    ``occupancy_waves_per_simd`` is the waves (warps) one SIMD (SM
    sub-partition) can hold given the register use alone."""

    name: str
    target: str
    vgprs: int
    agprs: int
    sgprs: int
    lds_bytes: int
    scratch_bytes: int
    vgpr_spills: int
    sgpr_spills: int
    mfma: dict[str, int] = field(default_factory=dict)
    max_threads: int = 0
    occupancy_waves_per_simd: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0

    @property
    def spills(self) -> int:
        """Registers spilled, VGPRs and SGPRs together (0 is what we want)."""
        return self.vgpr_spills + self.sgpr_spills

    @property
    def mfma_total(self) -> int:
        return sum(self.mfma.values())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ResourceReport":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def amd_waves_per_simd(vgprs: int) -> int:
    """Waves per SIMD that ``vgprs`` (the unified VGPR+AGPR count) allows."""
    alloc = max(AMD_VGPR_GRANULE, -(-vgprs // AMD_VGPR_GRANULE) * AMD_VGPR_GRANULE)
    return min(AMD_MAX_WAVES_PER_SIMD, AMD_VGPRS_PER_SIMD // alloc)


def nv_warps_per_scheduler(regs: int) -> int:
    """Warps per SM sub-partition that ``regs`` registers per thread allow."""
    alloc = max(NV_REG_GRANULE, -(-regs // NV_REG_GRANULE) * NV_REG_GRANULE)
    return min(NV_MAX_WARPS_PER_SCHEDULER, NV_REGS_PER_LANE // alloc)


def reports_to_json(reports: Sequence[ResourceReport]) -> bytes:
    return json.dumps([r.to_dict() for r in reports], sort_keys=True).encode()


def reports_from_json(data: bytes) -> list[ResourceReport]:
    return [ResourceReport.from_dict(d) for d in json.loads(data.decode())]


# --------------------------------------------------------------------------- AMD: clang


def _clang_cmd() -> list[str]:
    return [sys.executable, "-m", "ziglang", "clang"]


@functools.lru_cache(maxsize=None)
def clang_version() -> str:
    """The first line of ``clang --version`` of the ziglang clang."""
    try:
        out = subprocess.run(
            [*_clang_cmd(), "--version"], capture_output=True, text=True, timeout=120, check=False
        )
    except OSError as e:
        raise BackendUnavailable("offline", f"cannot run clang through ziglang: {e}") from e
    if out.returncode != 0 or "clang version" not in out.stdout:
        raise BackendUnavailable(
            "offline", f"clang from ziglang does not run ({out.stderr.strip() or out.stdout.strip()})"
        )
    return out.stdout.splitlines()[0].strip()


def clang_options(target, extra: Sequence[str] = ()) -> list[str]:
    return [*CLANG_OPTIONS, f"--offload-arch={target.arch}", *extra]


def _file_name(name: str) -> str:
    """A safe file name for the source: its last path component, made of
    letters, digits, '.', '_' and '-'."""
    base = os.path.basename(name) or "kernel.hip"
    return re.sub(r"[^A-Za-z0-9._-]", "_", base)


def clang_asm(source: str, name: str, target, extra_options: Sequence[str] = ()) -> str:
    """AMDGPU assembly of ``source`` for ``target``; CompileError with clang's
    output (locations named ``name``) if it does not compile."""
    fname = _file_name(name)
    with tempfile.TemporaryDirectory(prefix="mono-clang-") as tmp:
        with open(os.path.join(tmp, fname), "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [*_clang_cmd(), *clang_options(target, extra_options), "-o", "out.s", fname]
        try:
            out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=CLANG_TIMEOUT_S, check=False)
        except OSError as e:
            raise BackendUnavailable("offline", f"cannot run clang through ziglang: {e}") from e
        if out.returncode != 0:
            log = (out.stderr + out.stdout).strip()
            if "No module named ziglang" in log:
                raise BackendUnavailable("offline", "the Python package ziglang is not installed")
            # name the file as the caller knows it
            if fname != name:
                log = log.replace(f"{fname}:", f"{name}:")
            raise CompileError(log, source, name, clang_version())
        with open(os.path.join(tmp, "out.s"), encoding="utf-8") as f:
            return f.read()


_METADATA = re.compile(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata\s*$", re.M | re.S)
_FUNC_START = re.compile(r"^\s*\.type\s+([^,\s]+)\s*,\s*@function\s*$", re.M)
_MFMA = re.compile(r"^\s*(v_mfma_\w+|v_smfmac_\w+)\b", re.M)


def _function_bodies(asm: str) -> dict[str, str]:
    """Each function's text, from its ``.type name,@function`` to the next one."""
    starts = [(m.group(1), m.start()) for m in _FUNC_START.finditer(asm)]
    bodies: dict[str, str] = {}
    for i, (fname, pos) in enumerate(starts):
        end = starts[i + 1][1] if i + 1 < len(starts) else len(asm)
        body = asm[pos:end]
        # stop at the function's end label, before the metadata of what follows
        m = re.search(r"^\.Lfunc_end\d+:", body, re.M)
        bodies[fname] = body[: m.start()] if m else body
    return bodies


def count_mfma(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in _MFMA.finditer(text):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return dict(sorted(counts.items()))


def parse_amdgpu_asm(asm: str, target_name: str = "") -> list[ResourceReport]:
    """The ResourceReport of each kernel in AMDGPU assembly (``clang -S``)."""
    import yaml

    m = _METADATA.search(asm)
    if not m:
        raise ValueError("no .amdgpu_metadata block in the assembly")
    meta = yaml.safe_load(m.group(1)) or {}
    bodies = _function_bodies(asm)
    reports = []
    for k in meta.get("amdhsa.kernels", []) or []:
        name = str(k[".name"])
        vgprs = int(k.get(".vgpr_count", 0))
        reports.append(
            ResourceReport(
                name=name,
                target=target_name,
                vgprs=vgprs,
                agprs=int(k.get(".agpr_count", 0)),
                sgprs=int(k.get(".sgpr_count", 0)),
                lds_bytes=int(k.get(".group_segment_fixed_size", 0)),
                scratch_bytes=int(k.get(".private_segment_fixed_size", 0)),
                vgpr_spills=int(k.get(".vgpr_spill_count", 0)),
                sgpr_spills=int(k.get(".sgpr_spill_count", 0)),
                mfma=count_mfma(bodies.get(name, "")),
                max_threads=int(k.get(".max_flat_workgroup_size", 0)),
                occupancy_waves_per_simd=amd_waves_per_simd(vgprs),
            )
        )
    return reports


def amd_report(source: str, name: str, target, extra_options: Sequence[str] = ()) -> list[ResourceReport]:
    """ResourceReports of the kernels in ``source`` for an AMD ``target`` (uncached)."""
    return parse_amdgpu_asm(clang_asm(source, name, target, extra_options), target.name)


# --------------------------------------------------------------------------- NVIDIA: nvrtc + ptxas -v

_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_STACK = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_PTXAS_CUMSTACK = re.compile(r"(\d+) bytes cumulative stack size")
_PTX_FUNC = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)\s*\(", re.M)
_PTX_MMA = re.compile(r"^\s*(?:@!?%\w+\s+)?((?:wgmma\.)?mma(?:\.sp|_async)?(?:\.[\w:]+)*)", re.M)


def parse_ptxas_log(log: str) -> dict[str, dict[str, int]]:
    """Per entry function: regs, smem, stack, spill_stores, spill_loads."""
    entries: dict[str, dict[str, int]] = {}
    props: dict[str, tuple[int, int, int]] = {}
    entry = props_for = None
    for line in log.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = m.group(1)
            entries.setdefault(entry, {"regs": 0, "smem": 0, "cumstack": 0})
        elif m := _PTXAS_PROPS.search(line):
            props_for = m.group(1)
        elif m := _PTXAS_STACK.search(line):
            if props_for is not None:
                props[props_for] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif m := _PTXAS_USED.search(line):
            if entry is not None:
                e = entries[entry]
                e["regs"] = int(m.group(1))
                if s := _PTXAS_SMEM.search(line):
                    e["smem"] = int(s.group(1))
                if c := _PTXAS_CUMSTACK.search(line):
                    e["cumstack"] = int(c.group(1))
    out = {}
    for name, e in entries.items():
        stack, stores, loads = props.get(name, (0, 0, 0))
        out[name] = {
            "regs": e["regs"],
            "smem": e["smem"],
            "stack": max(stack, e["cumstack"]),
            "spill_stores": stores,
            "spill_loads": loads,
        }
    return out


def ptx_function_bodies(ptx: str) -> dict[str, tuple[str, str]]:
    """Each PTX function's (kind, text): kind 'entry' or 'func'."""
    starts = [(m.group(2), m.group(1), m.start()) for m in _PTX_FUNC.finditer(ptx)]
    out = {}
    for i, (name, kind, pos) in enumerate(starts):
        end = starts[i + 1][2] if i + 1 < len(starts) else len(ptx)
        out[name] = (kind, ptx[pos:end])
    return out


def count_mma(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in _PTX_MMA.finditer(text):
        op = m.group(1)
        counts[op] = counts.get(op, 0) + 1
    return dict(sorted(counts.items()))


def nvrtc_report(source: str, name: str, target, extra_options: Sequence[str] = ()) -> list[ResourceReport]:
    """ResourceReports of the kernels in ``source`` for an NVIDIA ``target``
    (uncached): one nvrtc compile with ``--ptxas-options=-v`` gives the CUBIN's
    resources in its log and the PTX to count ``mma`` instructions in."""
    from . import cuda

    opts = cuda.options(target, [*extra_options, "--ptxas-options=-v"])
    _, ptx, log = cuda.nvrtc_build(source, name, opts, want_cubin=True, want_ptx=True)
    usage = parse_ptxas_log(log)
    bodies = ptx_function_bodies(ptx or "")
    reports = []
    for kname, u in usage.items():
        _, body = bodies.get(kname, ("entry", ""))
        reports.append(
            ResourceReport(
                name=kname,
                target=target.name,
                vgprs=u["regs"],
                agprs=0,
                sgprs=0,
                lds_bytes=u["smem"],
                scratch_bytes=u["stack"],
                vgpr_spills=-(-u["spill_stores"] // 4),
                sgpr_spills=0,
                mfma=count_mma(body),
                max_threads=getattr(target, "max_threads", 0),
                occupancy_waves_per_simd=nv_warps_per_scheduler(u["regs"]),
                spill_store_bytes=u["spill_stores"],
                spill_load_bytes=u["spill_loads"],
            )
        )
    return reports


# --------------------------------------------------------------------------- dispatch + cache


def _compiler_and_options(target, extra_options: Sequence[str]) -> tuple[str, list[str]]:
    if target.vendor == "amd":
        return clang_version(), clang_options(target, extra_options)
    if target.vendor == "nvidia":
        from . import cuda

        return cuda.compiler_version(), cuda.options(target, [*extra_options, "--ptxas-options=-v"])
    raise ValueError(f"unknown vendor {target.vendor!r} of target {target.name!r}")


def compile_offline(source: str, name: str, target, extra_options: Sequence[str] = ()) -> list[ResourceReport]:
    """The ResourceReport of every kernel in ``source`` for ``target``, compiled
    with no GPU (clang for AMD targets, nvrtc for NVIDIA), cached on disk."""
    compiler, opts = _compiler_and_options(target, extra_options)
    parts = {
        "kind": "resource_report",
        "source": source,
        "options": opts,
        "compiler": compiler,
        "arch": target.arch,
        "name": name,
    }

    def build() -> bytes:
        if target.vendor == "amd":
            reports = amd_report(source, name, target, extra_options)
        else:
            reports = nvrtc_report(source, name, target, extra_options)
        return reports_to_json(reports)

    data, _ = cache.get_or_build(parts, build)
    return reports_from_json(data)
