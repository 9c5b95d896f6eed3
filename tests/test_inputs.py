"""Random launch arguments from the ABI alone (what `trace` launches by
default), built on the CPU: right dtypes and shapes, never zero inputs,
poisoned outputs, runtime dimensions as asked, scalars in range."""

from __future__ import annotations

import torch

import codegen
from codegen.inputs import DEFAULT_DIM, POISON_BYTE, random_args
from codegen.launch import torch_dtype


def test_random_args_follow_the_abi():
    kernel = codegen.load("minimax_m3/pre_attn", tokens=2, target="gfx942", timeline=True)
    runtime = sorted({d for a in kernel.ir.abi if a.is_tensor for d in a.shape if isinstance(d, str)})
    dims = {runtime[0]: 3} if runtime else {}
    args = random_args(kernel, seed=5, device="cpu", dims=dims)
    assert list(args) == [a.name for a in kernel.ir.abi if a.workspace is None] + \
        [a.name for a in kernel.ir.abi if a.workspace is not None]
    for a in kernel.ir.abi:
        v = args[a.name]
        if not a.is_tensor:
            assert isinstance(v, float if a.dtype == "f32" else int)
            if a.range is not None:
                assert a.range[0] <= v <= a.range[1]
            continue
        if a.workspace is None and a.optional:
            assert v is None
            continue
        assert v.dtype == torch_dtype(a.dtype, kernel.target), a.name
        want = tuple(dims.get(d, DEFAULT_DIM) if isinstance(d, str) else d for d in a.shape)
        assert tuple(v.shape) == want, a.name
        if a.workspace is not None:
            assert not v.view(torch.uint8).any(), f"{a.name}: workspace starts zeroed"
        elif a.intent == "out":
            assert (v.view(torch.uint8) == POISON_BYTE).all(), f"{a.name}: outputs poisoned"
        elif a.dtype in ("bf16", "fp8", "f32"):
            assert v.float().abs().sum() > 0 and torch.isfinite(v.float()).all(), f"{a.name}: random, finite"
    again = random_args(kernel, seed=5, device="cpu", dims=dims)
    assert torch.equal(again["ar"], args["ar"]), "a seed gives the same inputs"
