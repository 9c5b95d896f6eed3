"""The GPU targets a kernel is generated for, and the facts about each that the
lowering, the templates, the JIT and the launcher need.

One place for every per-target number: a stage template never tests a target's
name, it reads a field of its ``Target`` (wave size, FP8 flavour, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Target:
    name: str  # our name, also the folder of its device library
    vendor: Literal["amd", "nvidia"]
    arch: str  # what the compiler calls it (--offload-arch / --gpu-architecture)
    wave_size: int  # lanes that run in lockstep (AMD wave64, NVIDIA warp32)
    compute_units: int  # CUs / SMs of the reference part
    lds_bytes: int  # shared memory (LDS) one CTA may use
    max_threads: int  # threads per CTA
    fp8_flavour: Literal["fnuz", "ocp"]  # e4m3 FNUZ (gfx942) or OCP e4m3fn
    fp8_max: float  # largest finite e4m3 value of the flavour (MiniMax per-token quant)
    mma: str  # the FP8 matrix instruction the GEMV inner loop uses
    part: str  # the GPU this target stands for
    native_mma: str = ""  # an FP8 matrix instruction (prefix) a GEMV may use instead (sm90: wgmma, a knob)

    @property
    def torch_fp8_dtype_name(self) -> str:
        """The torch dtype holding this target's FP8 bytes."""
        return "float8_e4m3fnuz" if self.fp8_flavour == "fnuz" else "float8_e4m3fn"


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="gfx942",
            vendor="amd",
            arch="gfx942",
            wave_size=64,
            compute_units=304,
            lds_bytes=64 * 1024,
            max_threads=1024,
            fp8_flavour="fnuz",
            fp8_max=240.0,
            mma="v_mfma_f32_16x16x32_fp8_fp8",
            part="MI300X",
        ),
        Target(
            name="gfx950",
            vendor="amd",
            arch="gfx950",
            wave_size=64,
            compute_units=256,
            lds_bytes=160 * 1024,
            max_threads=1024,
            fp8_flavour="ocp",
            fp8_max=448.0,
            mma="v_mfma_f32_16x16x32_fp8_fp8",
            part="MI355X",
        ),
        Target(
            name="sm90",
            vendor="nvidia",
            arch="sm_90a",
            wave_size=32,
            compute_units=132,
            lds_bytes=227 * 1024,
            max_threads=1024,
            fp8_flavour="ocp",
            fp8_max=448.0,
            mma="mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
            native_mma="wgmma.mma_async.sync.aligned.m64n",  # n8 / n16, k32, f32 += e4m3 x e4m3
            part="H100/H200",
        ),
    )
}


def get_target(name: str) -> Target:
    """The target called ``name``; a clear error listing the known ones otherwise."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unknown target {name!r}: expected one of {', '.join(TARGETS)}"
        ) from None
