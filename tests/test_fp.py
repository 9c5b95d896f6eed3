"""Bit-exactness of codegen.fp against exact rational arithmetic."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from codegen.fp import bf16_rn, fma_f32, fp8_dtype, round_to_f32, sqrt_f32
from codegen.targets import TARGETS


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def _rand_f32(gen: torch.Generator, n: int, emin: int, emax: int) -> torch.Tensor:
    """Random f32 with random sign, 24-bit mantissa and exponent in [emin, emax]."""
    mant = 1.0 + torch.randint(0, 1 << 23, (n,), generator=gen, dtype=torch.int64).double() / 2.0**23
    exp = torch.randint(emin, emax + 1, (n,), generator=gen).double()
    sign = torch.randint(0, 2, (n,), generator=gen).double() * 2 - 1
    return (sign * mant * torch.pow(2.0, exp)).float()


def _exact_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    out = [
        round_to_f32(Fraction(x) * Fraction(y) + Fraction(z))
        for x, y, z in zip(a.double().tolist(), b.double().tolist(), c.double().tolist())
    ]
    return torch.tensor(out, dtype=torch.float64).float()


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    zero = (got == 0) & (want == 0)  # exact zero: sign not compared
    bad = (_bits(got) != _bits(want)) & ~zero
    assert not bool(bad.any()), (
        f"{int(bad.sum())} mismatches, first: got {got[bad][:4].tolist()} want {want[bad][:4].tolist()}"
    )


# ---------------------------------------------------------------- round_to_f32


def test_round_to_f32_matches_numpy_single_rounding():
    # numpy's f64 -> f32 is one RNE rounding of the (exact) f64 value
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(3000, generator=gen, dtype=torch.float64)
         * torch.pow(2.0, torch.randint(-160, 130, (3000,), generator=gen).double()))
    for v in x.tolist():
        with np.errstate(over="ignore"):
            want = float(np.float32(v))
        assert round_to_f32(Fraction(v)) == want, v


def test_round_to_f32_edges():
    flt_max = float(np.finfo(np.float32).max)
    ulp_top = 2**104
    assert round_to_f32(Fraction(flt_max) + Fraction(ulp_top, 2)) == float("inf")  # tie -> even
    assert round_to_f32(Fraction(flt_max) + Fraction(ulp_top, 2) - Fraction(1, 2**200)) == flt_max
    assert round_to_f32(Fraction(1, 2**150)) == 0.0  # tie to even (0)
    assert round_to_f32(Fraction(3, 2**150)) == 2.0**-148  # 1.5 ulp -> 2 ulp
    assert round_to_f32(Fraction(1) + Fraction(1, 2**24)) == 1.0
    assert round_to_f32(Fraction(1) + Fraction(3, 2**24)) == 1.0 + 2.0**-22


# ---------------------------------------------------------------- fma_f32


def test_fma_random_against_fraction():
    gen = torch.Generator().manual_seed(2)
    n = 4000
    a = _rand_f32(gen, n, -20, 20)
    b = _rand_f32(gen, n, -20, 20)
    # c near the product's magnitude (heavy overlap, cancellations)
    pe = torch.floor(torch.log2((a.double() * b.double()).abs())).long()
    shift = torch.randint(-30, 31, (n,), generator=gen)
    mant = _rand_f32(gen, n, 0, 0).double()
    c = (mant * torch.pow(2.0, (pe + shift).double())).float()
    # a quarter: c = -RN(a*b) (result is the exact product error)
    q = n // 4
    c[:q] = -(a[:q].double() * b[:q].double()).float()
    _assert_same(fma_f32(a, b, c), _exact_fma(a, b, c))


def test_fma_wide_range_and_subnormals():
    gen = torch.Generator().manual_seed(3)
    n = 2000
    a = _rand_f32(gen, n, -75, 60)
    b = _rand_f32(gen, n, -75, 60)
    c = _rand_f32(gen, n, -149 + 23, 127)
    c[: n // 2] = _rand_f32(gen, n // 2, -149 + 1, -120)  # small c: subnormal results
    _assert_same(fma_f32(a, b, c), _exact_fma(a, b, c))


def _crafted_midpoints(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """a*b + c whose f64 sum lands exactly on an f32 midpoint of c's binade
    while the exact value is a hair below (kind 0) or above (kind 1) it."""
    n = 1500
    c = _rand_f32(gen, n, -149 + 23, 126).abs()
    c[:100] = _rand_f32(gen, 100, -140, -127).abs()  # subnormal c
    c[100] = float(np.finfo(np.float32).max)
    c64 = c.double()
    # ulp of c's binade (subnormals share 2^-149)
    e = torch.floor(torch.log2(c64)).clamp(min=-126)
    half_ulp_exp = (e - 24).long()  # log2(ulp / 2)
    ea = half_ulp_exp // 2
    eb = half_ulp_exp - ea
    j = torch.randint(15, 24, (n,), generator=gen).double()
    kind = torch.randint(0, 2, (n,), generator=gen)
    kind[100] = 0
    x = torch.pow(2.0, -j)
    y = torch.full_like(x, 2.0**-12)
    # kind 0: (1+x)(1-x) = 1 - x^2 ; kind 1: (1+y)(1-y+y^2) = 1 + y^3
    fa = torch.where(kind == 0, 1 + x, 1 + y)
    fb = torch.where(kind == 0, 1 - x, 1 - y + y * y)
    a = (fa * torch.pow(2.0, ea.double())).float()
    b = (fb * torch.pow(2.0, eb.double())).float()
    assert torch.equal(a.double(), fa * torch.pow(2.0, ea.double()))  # representable
    assert torch.equal(b.double(), fb * torch.pow(2.0, eb.double()))
    sign = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1
    sign[100] = 1.0
    return a * sign, b, c * sign


def test_fma_crafted_midpoints():
    gen = torch.Generator().manual_seed(4)
    a, b, c = _crafted_midpoints(gen)
    want = _exact_fma(a, b, c)
    naive = (a.double() * b.double() + c.double()).float()
    # the crafted cases really hit the double-rounding trap (about half of them)
    assert int((_bits(naive) != _bits(want)).sum()) > 400
    assert not bool(torch.isinf(want[100]))  # FLT_MAX + (ulp/2)(1 - tiny) stays finite
    _assert_same(fma_f32(a, b, c), want)


def test_fma_specials_and_broadcast():
    inf = float("inf")
    a = torch.tensor([inf, 1.0, 2.0, float("nan")])
    b = torch.tensor([1.0, inf, 3.0, 1.0])
    c = torch.tensor([-inf, 1.0, -6.0, 1.0])
    r = fma_f32(a, b, c)
    assert torch.isnan(r[0]) and r[1] == inf and torch.isnan(r[3])
    assert r[2] == 0 and not torch.signbit(r[2])  # exact cancellation gives +0 (RNE)
    r = fma_f32(torch.tensor([[2.0], [3.0]]), torch.tensor([1.0, 2.0]), torch.tensor(1.0))
    assert r.tolist() == [[3.0, 5.0], [4.0, 7.0]]
    with pytest.raises(TypeError):
        fma_f32(torch.ones(2, dtype=torch.float64), torch.ones(2), torch.ones(2))


# ---------------------------------------------------------------- bf16 / fp8


def test_bf16_rn_is_rne():
    gen = torch.Generator().manual_seed(5)
    bits = torch.randint(-(2**31), 2**31, (200000,), generator=gen, dtype=torch.int64)
    # plus exact ties (low 16 bits 0x8000), odd and even
    bits[:1000] = (bits[:1000] & ~0xFFFF) | 0x8000
    x = bits.to(torch.int32).view(torch.float32)
    keep = ~torch.isnan(x)
    x = x[keep]
    u = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16  # unsigned bit formula
    want = torch.where(want >= 2**31, want - 2**32, want).to(torch.int32)
    got = bf16_rn(x)
    assert got.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want)
    assert torch.isnan(bf16_rn(torch.tensor([float("nan")]))).all()


def test_fp8_dtype_by_target():
    assert fp8_dtype(TARGETS["gfx942"]) == torch.float8_e4m3fnuz
    assert fp8_dtype(TARGETS["gfx950"]) == torch.float8_e4m3fn
    assert fp8_dtype("sm90") == torch.float8_e4m3fn
    for t in TARGETS.values():
        assert torch.finfo(fp8_dtype(t)).max == t.fp8_max


@pytest.mark.parametrize("name", ["gfx942", "sm90"])
def test_fp8_conversion_is_rne(name):
    dt = fp8_dtype(name)
    vals = torch.arange(0, 128, dtype=torch.uint8).view(dt).float()
    codes = torch.arange(0, 128)
    ok = torch.isfinite(vals)
    vals, codes = vals[ok], codes[ok]
    order = torch.argsort(vals)
    vals, codes = vals[order], codes[order]
    lo, hi = vals[:-1].double(), vals[1:].double()
    mid = ((lo + hi) / 2).float()
    assert torch.equal(mid.double(), (lo + hi) / 2)
    even = torch.where(codes[:-1] % 2 == 0, vals[:-1], vals[1:])
    assert torch.equal(mid.to(dt).float(), even)
    below = torch.nextafter(mid, torch.full_like(mid, -1.0))
    above = torch.nextafter(mid, torch.full_like(mid, 1e9))
    assert torch.equal(below.to(dt).float(), vals[:-1])
    assert torch.equal(above.to(dt).float(), vals[1:])
    assert torch.equal((-above).to(dt).float(), -vals[1:])


# ---------------------------------------------------------------- sqrt / basic ops


def test_sqrt_f32_correctly_rounded():
    import math

    gen = torch.Generator().manual_seed(6)
    x = _rand_f32(gen, 50000, -140, 120).abs()
    x[:10] = torch.tensor([0.25, 1.0, 4.0, 2.0, 1e-45, 3.4e38, float("inf"), 0.5, 9.0, 2.0**-149])
    want = torch.tensor([math.sqrt(v) for v in x.double().tolist()], dtype=torch.float64).float()
    got = sqrt_f32(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.equal(got, want)
    assert torch.equal(sqrt_f32(x.reshape(100, 500)), want.reshape(100, 500))
    assert torch.isnan(sqrt_f32(torch.tensor([-1.0]))).all()


def test_torch_f32_basic_ops_are_ieee():
    # f64 result rounded to f32 is the correctly rounded f32 result for + - * /
    gen = torch.Generator().manual_seed(7)
    x = _rand_f32(gen, 100000, -60, 60)
    y = _rand_f32(gen, 100000, -60, 60)
    X, Y = x.double(), y.double()
    assert torch.equal(x + y, (X + Y).float())
    assert torch.equal(x * y, (X * Y).float())
    assert torch.equal(x / y, (X / Y).float())
    assert torch.equal(x / torch.full_like(x, 6144.0), (X / 6144.0).float())
