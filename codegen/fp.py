"""Bit-exact floating-point helpers on torch tensors (CPU).

The references compute what the generated kernels compute, rounding for
rounding. These are the operations torch lacks or whose rounding has to be
stated: a correctly rounded f32 fma, the f32 -> bf16 conversion, the FP8 dtype
of a target, and an exact rounding of a rational number to f32 (the oracle of
the tests).

Caution: torch's CPU ``sqrt`` (f32 and f64, vectorized) is NOT correctly
rounded (about 1 in 150 f32 results is 1 ulp off); use :func:`sqrt_f32`.
torch's f32 ``+ - * /`` on CPU are IEEE (checked in the tests)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from codegen.targets import Target, get_target

__all__ = ["fma_f32", "sqrt_f32", "bf16_rn", "fp8_dtype", "round_to_f32"]


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` with one rounding to f32 (RNE), like the hardware ``fma``.

    Inputs are f32 tensors (broadcast together). The product of two f32 is exact
    in f64 (48 significant bits, exponent far inside f64's range), so the only
    rounding before the final one is the f64 sum ``s = p + c``. Rounding ``s``
    to f32 gives the correctly rounded result except when ``s`` lies exactly on
    an f32 rounding midpoint (f32 midpoints are f64 numbers) while the exact sum
    is not: then the TwoSum error term ``e`` (``p + c == s + e`` exactly) says
    which side the exact value is on, and ``s`` is nudged one f64 ulp toward
    ``e`` before the f64 -> f32 rounding. Inf/NaN propagate as in f64 math."""
    a, b, c = torch.broadcast_tensors(a, b, c)
    for name, t in (("a", a), ("b", b), ("c", c)):
        if t.dtype != torch.float32:
            raise TypeError(f"fma_f32: {name} must be float32, got {t.dtype}")
    p = a.double() * b.double()  # exact
    c64 = c.double()
    s = p + c64  # RN in f64
    # TwoSum (Knuth): p + c == s + err exactly (no overflow possible here).
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)

    r = s.float()  # RNE f64 -> f32 (possibly the wrong side of a tie)
    # The f32 neighbour of r on s's side, and the midpoint between them.
    # Overflow to inf only happens from the midpoint FLT_MAX + ulp/2 or beyond:
    # treat inf as 2^128 (the next power of two) to find that midpoint.
    r64 = torch.where(
        torch.isinf(r), torch.copysign(torch.full_like(s, 2.0**128), s), r.double()
    )
    toward = torch.where(s > r64, torch.full_like(r, float("inf")), torch.full_like(r, float("-inf")))
    nb = torch.nextafter(r, toward)
    mid = (r64 + nb.double()) * 0.5  # exact: sum of two f32 fits in f64
    fix = (s == mid) & (err != 0) & torch.isfinite(s) & torch.isfinite(err)
    if bool(fix.any()):
        direction = torch.where(err > 0, torch.full_like(s, float("inf")), torch.full_like(s, float("-inf")))
        s = torch.where(fix, torch.nextafter(s, direction), s)
        r = s.float()
    return r


def sqrt_f32(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded (RNE) f32 square root of an f32 tensor, via numpy's
    ``np.sqrt`` (the hardware sqrt instruction); torch's own CPU sqrt is not
    correctly rounded."""
    if x.dtype != torch.float32:
        raise TypeError(f"sqrt_f32: x must be float32, got {x.dtype}")
    with np.errstate(invalid="ignore"):  # negative -> NaN, as IEEE says
        out = np.sqrt(x.detach().cpu().contiguous().numpy())
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(x.shape)


def bf16_rn(x: torch.Tensor) -> torch.Tensor:
    """f32 -> bf16 round-to-nearest-even, returned as f32 (torch's conversion is
    RNE, NaN stays NaN; the tests check this against the bit formula)."""
    return x.float().to(torch.bfloat16).float()


def fp8_dtype(target: Target | str) -> torch.dtype:
    """The torch dtype of the target's FP8 bytes: ``float8_e4m3fnuz`` (gfx942,
    FNUZ, max 240) or ``float8_e4m3fn`` (gfx950/sm90, OCP, max 448). torch's
    f32 -> these conversions round to nearest even."""
    if isinstance(target, str):
        target = get_target(target)
    return getattr(torch, target.torch_fp8_dtype_name)


def round_to_f32(x: Fraction | int | float) -> float:
    """The exact rational ``x`` rounded once to f32 (RNE, IEEE overflow to
    +-inf, gradual underflow), returned as the Python float holding that f32.
    Slow scalar oracle for tests; a zero result is +0.0."""
    x = Fraction(x)
    if x == 0:
        return 0.0
    sign = -1 if x < 0 else 1
    m = abs(x)
    # exponent e with 2^e <= m < 2^(e+1)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    elif Fraction(2) ** (e + 1) <= m:
        e += 1
    e = max(e, -126)  # subnormal range shares the quantum of the lowest binade
    q = Fraction(2) ** (e - 23)
    scaled = m / q
    n = scaled.numerator // scaled.denominator
    rem = scaled - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    val = n * q
    if val >= Fraction(2) ** 128:
        return sign * float("inf")
    return sign * float(val)  # exact: at most 24 significant bits
