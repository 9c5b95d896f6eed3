"""The unfused MiniMax-M3 pre_attn chain (the benchmark's peer) against the
exact reference, on the CPU.

What is compared, and why these tolerances:
* h_out: exact (one f32 add, one RNE conversion in both).
* x_scale: within 2^-20 relative. The chain's ``mean`` and ``rsqrt`` are
  torch's (another summation order, not correctly rounded), so normed values
  and their amax differ in the last f32 bits.
* x8: a value may sit on the neighbouring FP8 code (when its quotient lies
  within those bits of a rounding midpoint): only adjacent codes, and rarely.
* qkv: every element within ``compare_qkv``'s bound: 2 bf16 ulps + 2^-16 of
  sum_k |x8 * w| * scales (f32 accumulation order; values whose dot product
  cancels to near zero can be many ulps off and still as accurate as the
  inputs allow) + the exact effect of the FP8 flips. And >= 99 % of values
  within 2 ulps: a flip moves every output of its token, so a single flip can
  push some tenths of a percent of a token's values past 2 ulps."""

from __future__ import annotations

import pytest
import torch

from codegen.reference import minimax_m3 as ref
from codegen.reference.minimax_m3_unfused import (
    bf16_ulp,
    compare_qkv,
    compare_quant,
    fp8_gemm_rowwise,
    norm_quant_unfused,
    pick_gemm,
    pre_attn_unfused,
)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
EPS = 1e-6
REL_ACC_CPU = 2.0**-16  # f32 accumulation on the CPU (seen: < 2^-25)


def make_inputs(tokens: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "ar": (torch.randn(tokens, ref.HIDDEN, generator=g) * 0.7).bfloat16(),
        "res": (torch.randn(tokens, ref.HIDDEN, generator=g) * 1.3).bfloat16(),
        "g_in": (torch.randn(ref.HIDDEN, generator=g) * 0.1).bfloat16(),
        "w": (torch.randn(ref.QKV_ROWS, ref.HIDDEN, generator=g) * 0.3).clamp(-FP8_MAX, FP8_MAX).to(FP8),
        "s": torch.rand(ref.QKV_ROWS, generator=g) * 0.02 + 0.005,
    }


_cache: dict = {}


def case(tokens: int, seed: int):
    """Inputs and the exact reference (computed once per case)."""
    key = (tokens, seed)
    if key not in _cache:
        inp = make_inputs(tokens, seed)
        want = ref.pre_attn_front(inp["ar"], inp["res"], inp["g_in"], inp["w"], inp["s"], EPS, "sm90")
        _cache[key] = (inp, want)
    return _cache[key]


@pytest.mark.parametrize("gemm", ["dequant", "scaled_mm"])
@pytest.mark.parametrize("tokens,seed", [(1, 101), (4, 201), (16, 1600)])
def test_unfused_matches_reference(tokens, seed, gemm):
    inp, want = case(tokens, seed)
    h_out, qkv, x8, x_scale = pre_attn_unfused(
        inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX,
        gemm=gemm, return_quant=True)
    assert h_out.dtype == torch.bfloat16 and qkv.dtype == torch.bfloat16
    assert qkv.shape == (tokens, ref.QKV_ROWS) and x_scale.shape == (tokens, 1)
    assert torch.equal(h_out.view(torch.int16), want["h_out"].view(torch.int16))

    q = compare_quant(x8, x_scale, want["x8"], want["x_scale"])
    assert q["x_scale_max_rel"] <= 2.0**-20, q
    assert q["x8_max_code_distance"] <= 1, q
    assert q["x8_flips"] <= max(2, q["x8_values"] // 10_000), q

    c = compare_qkv(qkv, x8, x_scale, want["qkv"], want["x8"], want["x_scale"], inp["w"], inp["s"],
                    rel_acc=REL_ACC_CPU)
    assert c["ok"], c
    assert c["frac_le2"] >= 0.99, c


def test_seed_with_fp8_flip_is_covered():
    """S = 16, seed 1600: the chain's x8 differs from the contract's in one
    value (found by search). The flip term of the bound must carry it: without
    it the comparison fails, with it it passes."""
    inp, want = case(16, 1600)
    _, qkv, x8, xs = pre_attn_unfused(inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8,
                                      FP8_MAX, gemm="dequant", return_quant=True)
    q = compare_quant(x8, xs, want["x8"], want["x_scale"])
    assert q["x8_flips"] >= 1, "seed no longer produces a flip: pick another"
    no_flip = compare_qkv(qkv, want["x8"], xs, want["qkv"], want["x8"], want["x_scale"], inp["w"], inp["s"],
                          rel_acc=REL_ACC_CPU)
    assert not no_flip["ok"]


def test_gemm_given_same_quant_is_tight():
    """Given the contract's own x8 and scales, both GEMMs are within 2 ulps of
    the exactly rounded one except where the dot product cancels (bound)."""
    inp, want = case(4, 201)
    for gemm in ("dequant", "scaled_mm"):
        qkv = fp8_gemm_rowwise(want["x8"], want["x_scale"], inp["w"].t(), inp["s"], gemm)
        c = compare_qkv(qkv, want["x8"], want["x_scale"], want["qkv"], want["x8"], want["x_scale"],
                        inp["w"], inp["s"], rel_acc=REL_ACC_CPU)
        assert c["ok"] and c["frac_le1"] >= 0.999, (gemm, c)


def test_padding_rows_changes_nothing():
    inp, want = case(4, 201)
    a = fp8_gemm_rowwise(want["x8"], want["x_scale"], inp["w"].t(), inp["s"], "scaled_mm", pad_m=1)
    b = fp8_gemm_rowwise(want["x8"], want["x_scale"], inp["w"].t(), inp["s"], "scaled_mm", pad_m=16)
    assert b.shape == a.shape and torch.equal(a, b)


def test_zero_row_has_unit_scale():
    """acc == 0 (ar = -res): x_scale 1.0 (contract A.5.2), x8 and qkv zero."""
    inp = make_inputs(2, 5)
    res = inp["res"].clone()
    res[1] = -inp["ar"][1]
    h, qkv, x8, xs = pre_attn_unfused(inp["ar"], res, inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX,
                                      gemm="dequant", return_quant=True)
    assert xs[1, 0].item() == 1.0 and not x8[1].float().any() and not qkv[1].float().any()
    assert not h[1].float().any()


def test_pick_gemm_on_cpu():
    assert pick_gemm("cpu") == "dequant"


def test_bf16_ulp():
    x = torch.tensor([1.0, 1.5, 2.0, -3.0, 0.0])
    assert bf16_ulp(x).tolist() == [2.0**-7, 2.0**-7, 2.0**-6, 2.0**-6, 2.0**-133]
    nxt = (x[:4].bfloat16().view(torch.int16) + 1).view(torch.bfloat16).float()
    assert torch.equal((nxt - x[:4].bfloat16().float()).abs(), bf16_ulp(x[:4]))


def test_compiles_without_graph_breaks():
    """torch.compile traces the whole chain as one graph (the bench compiles
    it with inductor on the GPU; the eager backend checks the tracing here)."""
    torch._dynamo.reset()
    inp, _ = case(1, 101)
    fn = torch.compile(pre_attn_unfused, backend="eager", fullgraph=True, dynamic=False)
    h, qkv = fn(inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX, gemm="dequant")
    h2, qkv2 = pre_attn_unfused(inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX,
                                gemm="dequant")
    assert torch.equal(h, h2) and torch.equal(qkv, qkv2)


def test_norm_quant_unfused_shapes():
    inp = make_inputs(3, 9)
    h, x8, xs = norm_quant_unfused(inp["ar"], inp["res"], inp["g_in"], EPS, FP8, FP8_MAX)
    assert h.shape == (3, ref.HIDDEN) and x8.dtype == FP8 and xs.shape == (3, 1) and xs.dtype == torch.float32
