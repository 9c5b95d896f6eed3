"""The MiniMax-M3 K1 front reference (codegen.reference.minimax_m3)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from codegen.fp import bf16_rn, fp8_dtype, round_to_f32
from codegen.reference import minimax_m3 as mm
from codegen.targets import TARGETS

EPS = 1e-6
S = 4


def _inputs(seed: int, s: int = S):
    gen = torch.Generator().manual_seed(seed)
    ar = (torch.randn(s, mm.HIDDEN, generator=gen) * 0.7).to(torch.bfloat16)
    res = (torch.randn(s, mm.HIDDEN, generator=gen) * 2.0).to(torch.bfloat16)
    # never an exactly zero sum (ar == -res): move such res elements away
    res = torch.where(ar.float() + res.float() == 0, res + 0.5, res)
    assert bool((ar.float() + res.float() != 0).all())
    g_in = (torch.randn(mm.HIDDEN, generator=gen) * 0.2).to(torch.bfloat16)
    assert bool((g_in.float() + 1 != 0).all())
    return ar, res, g_in


def _weights(seed: int, n: int, target):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, mm.HIDDEN, generator=gen) * 60.0).clamp(-200, 200).to(fp8_dtype(target))
    s_qkv = (torch.rand(n, generator=gen) * 1e-3 + 1e-4).float()
    return w, s_qkv


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()).abs() / b.double().abs()).max())


# ---------------------------------------------------------------- A.5.1


def test_residual_add():
    ar, res, _ = _inputs(1)
    acc, h_out = mm.residual_add(ar, res)
    assert acc.dtype == torch.float32 and h_out.dtype == torch.bfloat16
    assert acc.shape == (S, mm.HIDDEN)
    assert torch.equal(acc, (ar.double() + res.double()).float())
    assert torch.equal(h_out.float(), bf16_rn(acc))


# ---------------------------------------------------------------- A.5.2 sum of squares


def _slow_sumsq(row: list[float]) -> float:
    """The A.5.2 order written with scalars: exact-rational fma, numpy f32 adds."""
    f32 = np.float32
    lts = []
    for lt in range(768):
        p = Fraction(0)
        for e in range(8):
            v = Fraction(row[8 * lt + e])
            p = Fraction(round_to_f32(v * v + p))
        lts.append(f32(float(p)))

    def butterfly(s):
        for off in (16, 8, 4, 2, 1):
            s = [f32(s[i] + s[i ^ off]) for i in range(32)]
        assert all(x == s[0] for x in s)
        return s[0]

    warps = [butterfly(lts[32 * w: 32 * w + 32]) for w in range(24)]
    return float(butterfly(warps + [f32(0.0)] * 8))


def test_rms_sumsq_exact_order():
    ar, res, _ = _inputs(2, s=2)
    acc, _ = mm.residual_add(ar, res)
    tot = mm.rms_sumsq(acc)
    assert tot.shape == (2,) and tot.dtype == torch.float32
    for r in range(2):
        assert float(tot[r]) == _slow_sumsq(acc[r].double().tolist())


def test_rms_sumsq_vs_float64():
    ar, res, _ = _inputs(3, s=8)
    acc, _ = mm.residual_add(ar, res)
    tot = mm.rms_sumsq(acc)
    assert _rel(tot, (acc.double() ** 2).sum(dim=1)) < 1e-6


# ---------------------------------------------------------------- rsq / norm


def test_rsq_ieee_is_correctly_rounded():
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(20000, generator=gen) * 10 + 1e-6
    # math.sqrt is the correctly rounded f64 sqrt; f64 -> f32 is innocuous
    sq = torch.tensor([math.sqrt(v) for v in x.double().tolist()], dtype=torch.float64).float()
    want = (1.0 / sq.double()).float()
    assert torch.equal(mm.rsq(x, "ieee"), want)
    assert torch.equal(mm.rsq(x, "approx"), want)
    with pytest.raises(ValueError):
        mm.rsq(x, "fast")


def test_gemma_rmsnorm_vs_float64():
    ar, res, g_in = _inputs(5)
    acc, _ = mm.residual_add(ar, res)
    n = mm.gemma_rmsnorm(acc, g_in, EPS)
    assert n.dtype == torch.float32 and n.shape == acc.shape
    a64 = acc.double()
    rstd = 1.0 / torch.sqrt((a64**2).mean(dim=1, keepdim=True) + EPS)
    n64 = a64 * rstd * (g_in.double() + 1.0)
    assert _rel(n, n64) < 1e-6


def test_gemma_rmsnorm_rounding_steps():
    """The stated f32 op sequence, spelled out with scalars for one row."""
    ar, res, g_in = _inputs(6, s=1)
    acc, _ = mm.residual_add(ar, res)
    n = mm.gemma_rmsnorm(acc, g_in, EPS)
    f32 = np.float32
    tot = f32(mm.rms_sumsq(acc)[0].item())
    mean = f32(tot / f32(6144.0))
    rstd = f32(f32(1.0) / f32(np.sqrt(f32(mean + f32(EPS)))))
    a = acc[0].numpy()
    g = g_in.float().numpy()
    want = (a * rstd) * (g + f32(1.0))
    assert want.dtype == np.float32
    assert np.array_equal(n[0].numpy(), want)


# ---------------------------------------------------------------- per-token FP8


def _fp8_ulp(q: torch.Tensor, flavour: str) -> torch.Tensor:
    emin = -6 if flavour == "ocp" else -7
    e = torch.floor(torch.log2(q.abs().clamp(min=1e-30))).clamp(min=emin)
    return torch.pow(2.0, e - 3)


@pytest.mark.parametrize("name", list(TARGETS))
def test_per_token_fp8(name):
    t = TARGETS[name]
    ar, res, g_in = _inputs(7)
    acc, _ = mm.residual_add(ar, res)
    normed = mm.gemma_rmsnorm(acc, g_in, EPS)
    x8, xs = mm.per_token_fp8(normed, t)
    assert x8.dtype == fp8_dtype(t) and x8.shape == normed.shape
    assert xs.dtype == torch.float32 and xs.shape == (S,)
    amax = normed.abs().amax(dim=1)
    assert torch.equal(xs, amax / torch.full_like(amax, t.fp8_max))
    xf = x8.float()
    assert torch.isfinite(xf).all()
    assert torch.equal(xf.abs().amax(dim=1), torch.full((S,), t.fp8_max))
    q = normed.double() / xs.double()[:, None]
    err = (xf.double() - q).abs()
    assert bool((err <= 0.5 * _fp8_ulp(q, t.fp8_flavour) * (1 + 1e-6)).all())
    # dequantized in the normed domain, same bound scaled by x_scale
    deq = xf.double() * xs.double()[:, None]
    bound = 0.5 * _fp8_ulp(q, t.fp8_flavour) * xs.double()[:, None] * (1 + 1e-6) + 1e-7 * normed.double().abs()
    assert bool(((deq - normed.double()).abs() <= bound).all())
    # bit-exact to the stated f32 division then RNE conversion
    assert torch.equal(x8.view(torch.uint8), (normed / xs[:, None]).to(fp8_dtype(t)).view(torch.uint8))


@pytest.mark.parametrize("name", ["gfx942", "sm90"])
def test_per_token_fp8_zero_row(name):
    # the one explicitly allowed all-zero case: a zero row gets scale 1.0
    gen = torch.Generator().manual_seed(8)
    normed = torch.randn(3, mm.HIDDEN, generator=gen)
    normed[1] = 0.0
    x8, xs = mm.per_token_fp8(normed, name)
    assert xs[1].item() == 1.0
    assert (x8[1].float() == 0).all()
    assert xs[0].item() != 1.0 and xs[2].item() != 1.0


def test_norm_quant_dict():
    ar, res, g_in = _inputs(9)
    out = mm.norm_quant(ar, res, g_in, EPS, TARGETS["gfx950"])
    assert set(out) == {"h_out", "normed", "x8", "x_scale"}
    acc, h_out = mm.residual_add(ar, res)
    assert torch.equal(out["h_out"], h_out)
    assert torch.equal(out["normed"], mm.gemma_rmsnorm(acc, g_in, EPS))


# ---------------------------------------------------------------- A.5.3 GEMV


@pytest.mark.parametrize("name", list(TARGETS))
def test_qkv_gemv_vs_float64(name):
    t = TARGETS[name]
    ar, res, g_in = _inputs(10)
    nq = mm.norm_quant(ar, res, g_in, EPS, t)
    w, s_qkv = _weights(11, 512, t)
    qkv = mm.qkv_gemv(nq["x8"], nq["x_scale"], w, s_qkv)
    assert qkv.dtype == torch.float32 and qkv.shape == (S, 512)
    assert torch.equal(qkv, bf16_rn(qkv))
    ref = (nq["x8"].double() @ w.double().T) * nq["x_scale"].double()[:, None] * s_qkv.double()[None, :]
    ref_bf16 = ref.float().to(torch.bfloat16).float()
    d = mm.bf16_ulp_diff(qkv, ref_bf16)
    assert int(d.max()) <= 1
    assert float((d == 0).float().mean()) > 0.9
    # the stated f32 epilogue, exactly
    tot = (nq["x8"].double() @ w.double().T).float()
    assert torch.equal(qkv, bf16_rn((tot * nq["x_scale"][:, None]) * s_qkv[None, :]))


def test_pre_attn_front_full_rows():
    t = TARGETS["sm90"]
    ar, res, g_in = _inputs(12, s=2)
    w, s_qkv = _weights(13, mm.QKV_ROWS, t)
    out = mm.pre_attn_front(ar, res, g_in, w, s_qkv, EPS, t)
    assert set(out) == {"h_out", "x8", "x_scale", "qkv"}
    assert out["qkv"].shape == (2, mm.QKV_ROWS)
    nq = mm.norm_quant(ar, res, g_in, EPS, t)
    assert torch.equal(out["x8"].view(torch.uint8), nq["x8"].view(torch.uint8))
    assert torch.equal(out["qkv"], mm.qkv_gemv(nq["x8"], nq["x_scale"], w, s_qkv))


# ---------------------------------------------------------------- bf16 ulps


def test_bf16_ulp_diff():
    one = torch.tensor([1.0])
    nxt = torch.nextafter(one.to(torch.bfloat16), torch.tensor([2.0], dtype=torch.bfloat16)).float()
    tiny = torch.tensor([1], dtype=torch.int16).view(torch.bfloat16).float()
    a = torch.cat([one, one, tiny, torch.tensor([0.0]), torch.tensor([-2.0])])
    b = torch.cat([one, nxt, -tiny, torch.tensor([-0.0]), torch.tensor([2.0])])
    d = mm.bf16_ulp_diff(a, b)
    assert d.tolist()[:4] == [0, 1, 2, 0]
    assert d[4].item() == 2 * 0x4000
    assert torch.equal(mm.bf16_ulp_diff(a.to(torch.bfloat16), b), d)
    with pytest.raises(ValueError):
        mm.bf16_ulp_diff(torch.tensor([1.0 + 2.0**-20]), one)


def test_reference_scores_kept_for_equal_inputs():
    """tests.minimax_case.reference_scores (the GPU tests' index-scores reference, once a case
    across the scorer tunes): inputs of equal bytes give the kept result; another index q, or
    other pinned blocks, give index_scores' own."""
    from tests.minimax_case import context_case, reference_scores

    case = context_case(4, 2, [5000, 70000], seed=1)
    g = torch.Generator().manual_seed(5)
    iq = torch.randn(4, 128, generator=g).bfloat16().float()
    cache = case["index_cache_bytes"].view(torch.float8_e4m3fn)
    table, seq = case["block_table"], case["seq_lens"]
    first = reference_scores(iq, cache, table, seq, 2)
    assert reference_scores(iq.clone(), cache.clone(), table.clone(), seq.clone(), 2) is first
    for other_iq, pinned in ((iq.flip(0), ()), (iq, (1, 2))):
        got = reference_scores(other_iq, cache, table, seq, 2, *pinned)
        want = mm.index_scores(other_iq, cache, table, seq, 2, *pinned)
        assert got is not first and all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(got, want))
        assert not torch.equal(got[0].nan_to_num(), first[0].nan_to_num())
