"""Random launch arguments for any build, read from its ABI: what ``trace``,
the op tests and quick experiments launch with when the values do not matter
for the check (timing, plumbing), only that they are realistic and never zero.

Numerical tests build their inputs themselves, next to the reference they are
compared against (``tests/test_minimax_pre_attn_gpu.py``)."""

from __future__ import annotations

from typing import Any

from .launch import Kernel, torch_dtype

BF16_STD = 0.7  # activations of a decoder layer's residual stream
FP8_STD = 0.3  # weights, before the per-row scale
SCALE_LO, SCALE_HI = 0.005, 0.025  # f32 inputs are per-row / per-token scales: positive
POISON_BYTE = 0xFF  # out tensors start as NaN patterns, never a value a kernel writes
DEFAULT_DIM = 1  # a runtime dimension's size unless given: zero indices stay inside it


def random_args(kernel: Kernel, seed: int = 0, device: Any = "cuda", dims: dict[str, int] | None = None,
                workspace: bool = True) -> dict[str, Any]:
    """Every argument of ``kernel``'s ABI: random inputs by dtype (bf16
    normal, fp8 normal within the target's range, f32 uniform positive
    scales, u8 uniform bytes; integer tensors zero, since they index tables a
    random value would overrun), out tensors filled with 0xff bytes, optional
    tensors None, scalars at the low end of their range (0 without one).
    A runtime dimension (a name in the ABI shape) takes its size from
    ``dims``, else ``DEFAULT_DIM``. With ``workspace``, the workspace
    buffers from ``kernel.workspace(device)`` too."""
    import torch

    g = torch.Generator().manual_seed(seed)
    target = kernel.target
    dims = dims or {}
    out: dict[str, Any] = {}
    for a in kernel.ir.abi:
        if a.workspace is not None:
            continue
        if not a.is_tensor:
            out[a.name] = 1.0 if a.dtype == "f32" else (a.range[0] if a.range is not None else 0)
            continue
        if a.optional:
            out[a.name] = None
            continue
        shape = tuple(dims.get(d, DEFAULT_DIM) if isinstance(d, str) else d for d in a.shape)
        dtype = torch_dtype(a.dtype, target)
        if a.intent == "out":
            t = torch.empty(shape, dtype=dtype)
            t.view(torch.uint8).fill_(POISON_BYTE)
        elif a.dtype == "bf16":
            t = (torch.randn(shape, generator=g) * BF16_STD).to(dtype)
        elif a.dtype == "fp8":
            t = (torch.randn(shape, generator=g) * FP8_STD).clamp(-target.fp8_max, target.fp8_max).to(dtype)
        elif a.dtype == "f32":
            t = torch.rand(shape, generator=g) * (SCALE_HI - SCALE_LO) + SCALE_LO
        elif a.dtype == "u8":
            t = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        else:
            t = torch.zeros(shape, dtype=dtype)
        out[a.name] = t.to(device)
    if workspace:
        out.update(kernel.workspace(device))
    return out
