"""The production-style UNFUSED PyTorch op chain that the MiniMax-M3 pre_attn
kernel replaces (contract C.1 steps 1-2), written for speed on the GPU: the
peer the benchmarks time, eager and under ``torch.compile``.

    acc    = f32(ar) + f32(res)                      -> h_out = bf16(acc)
    normed = acc * rsqrt(mean(acc^2) + eps) * (1 + f32(g_in))      (f32)
    x_scale[t] = amax|normed[t]| / FP8_MAX (1.0 where amax == 0)   (f32, [S, 1])
    x8     = fp8(clamp(normed / x_scale, +-FP8_MAX))
    qkv    = bf16((x8 @ w^T) * x_scale * s_qkv)      (torch._scaled_mm, rowwise)

Unlike :mod:`codegen.reference.minimax_m3` (the exact numerical contract) this
uses plain torch ops: ``mean`` and ``rsqrt`` in torch's own reduction order and
rounding, so ``normed`` may differ from the contract's in the last f32 bits and
an FP8 value lying on a rounding boundary can land one FP8 step away. ``h_out``
is exact. The GEMM is ``torch._scaled_mm`` (FP8 tensor cores, rowwise scales;
torch's CUTLASS sm90 kernel's epilogue is ``(acc * scale_a) * scale_b`` then
bf16, the contract's order) where the device has one (CUDA sm89+, ROCm
gfx94x/gfx95x), else a dequantized f32 matmul.

``w_qkv_t`` is the logical weight ``w [N, K]`` (row-major, one row per output
channel) seen transposed: ``w.t()``, a ``[K, N]`` column-major view, the
layout ``torch._scaled_mm`` wants for its second operand. Shapes the rowwise
``_scaled_mm`` needs (torch's meta checks, ``_meta_registrations.py``): the
first operand row-major with K % 16 == 0, the second column-major with both
dims % 16 == 0, ``scale_a`` [M, 1] and ``scale_b`` [1, N], f32, contiguous.
M (the token count) needs no padding (CUTLASS pads the scale itself);
``pad_m`` is there in case a backend wants it."""

from __future__ import annotations

import torch

from codegen.reference.minimax_m3 import bf16_ulp_diff

__all__ = [
    "GEMMS",
    "scaled_mm_available",
    "pick_gemm",
    "norm_quant_unfused",
    "fp8_gemm_rowwise",
    "pre_attn_unfused",
    "bf16_ulp",
    "compare_quant",
    "compare_qkv",
]

GEMMS = ("scaled_mm", "dequant")


def scaled_mm_available(device: torch.device | str) -> bool:
    """Whether ``torch._scaled_mm`` with FP8 rowwise scales runs on ``device``
    natively (FP8 tensor cores): CUDA sm89 or newer, ROCm MI300 (gfx94x) or
    MI355 (gfx95x). The CPU has a ``_scaled_mm`` too (slow; tests use it)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    props = torch.cuda.get_device_properties(device)
    if getattr(torch.version, "hip", None):
        arch = (getattr(props, "gcnArchName", "") or "").split(":")[0]
        return arch.startswith(("gfx94", "gfx95"))
    return (props.major, props.minor) >= (8, 9)


def pick_gemm(device: torch.device | str) -> str:
    """``"scaled_mm"`` where :func:`scaled_mm_available`, else ``"dequant"``."""
    return "scaled_mm" if scaled_mm_available(device) else "dequant"


def norm_quant_unfused(
    ar: torch.Tensor,
    res: torch.Tensor,
    g_in: torch.Tensor,
    eps: float,
    fp8_dtype: torch.dtype,
    fp8_max: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residual add, gemma RMSNorm in f32 and per-token FP8 quant, as plain
    torch ops. Returns ``(h_out bf16 [S, K], x8 fp8 [S, K], x_scale f32 [S, 1])``."""
    acc = ar.float() + res.float()
    h_out = acc.to(torch.bfloat16)
    var = acc.pow(2).mean(dim=-1, keepdim=True)
    normed = acc * torch.rsqrt(var + eps) * (1.0 + g_in.float())
    amax = normed.abs().amax(dim=-1, keepdim=True)
    x_scale = torch.where(amax == 0, torch.ones_like(amax), amax / fp8_max)
    x8 = (normed / x_scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return h_out, x8, x_scale


def fp8_gemm_rowwise(
    x8: torch.Tensor,
    x_scale: torch.Tensor,
    w_qkv_t: torch.Tensor,
    s_qkv: torch.Tensor,
    gemm: str = "scaled_mm",
    pad_m: int = 1,
) -> torch.Tensor:
    """``bf16((x8 @ w_qkv_t) * x_scale * s_qkv)``: ``x8 [M, K]`` fp8
    row-major, ``x_scale [M, 1]`` (or ``[M]``) f32, ``w_qkv_t [K, N]`` fp8
    column-major, ``s_qkv [N]`` f32. Returns bf16 ``[M, N]``.

    ``gemm="scaled_mm"``: ``torch._scaled_mm`` with rowwise scales, rows padded
    to a multiple of ``pad_m`` (zeros, scale 1) and sliced back.
    ``gemm="dequant"``: an f32 matmul of the dequantized operands (the same
    ``(acc * x_scale) * s_qkv`` epilogue), for devices without FP8 GEMMs."""
    if gemm not in GEMMS:
        raise ValueError(f"fp8_gemm_rowwise: gemm must be one of {GEMMS}, got {gemm!r}")
    m = x8.shape[0]
    scale_a = x_scale.reshape(m, 1)
    if gemm == "dequant":
        acc = x8.float() @ w_qkv_t.float()
        return ((acc * scale_a) * s_qkv.reshape(1, -1)).to(torch.bfloat16)
    if pad_m > 1 and m % pad_m:
        mp = -(-m // pad_m) * pad_m
        x8 = torch.cat([x8, x8.new_zeros(mp - m, x8.shape[1])])
        scale_a = torch.cat([scale_a, scale_a.new_ones(mp - m, 1)])
    out = torch._scaled_mm(
        x8, w_qkv_t, scale_a=scale_a.contiguous(), scale_b=s_qkv.reshape(1, -1),
        out_dtype=torch.bfloat16,
    )
    return out[:m] if out.shape[0] != m else out


def pre_attn_unfused(
    ar: torch.Tensor,
    res: torch.Tensor,
    g_in: torch.Tensor,
    w_qkv_t: torch.Tensor,
    s_qkv: torch.Tensor,
    eps: float,
    fp8_dtype: torch.dtype,
    fp8_max: float,
    gemm: str | None = None,
    pad_m: int = 1,
    return_quant: bool = False,
) -> tuple[torch.Tensor, ...]:
    """The unfused chain: returns ``(h_out bf16 [S, 6144], qkv bf16 [S, N])``,
    and with ``return_quant`` also ``x8 [S, 6144]`` and ``x_scale [S, 1]``
    (the GEMM's inputs: materialized anyway, so returning them costs nothing).
    ``gemm`` is ``"scaled_mm"`` / ``"dequant"``, or None for :func:`pick_gemm`
    of the input's device (pass it explicitly under ``torch.compile``)."""
    if gemm is None:
        gemm = pick_gemm(ar.device)
    h_out, x8, x_scale = norm_quant_unfused(ar, res, g_in, eps, fp8_dtype, fp8_max)
    qkv = fp8_gemm_rowwise(x8, x_scale, w_qkv_t, s_qkv, gemm, pad_m)
    if return_quant:
        return h_out, qkv, x8, x_scale
    return h_out, qkv


# ----------------------------------------------------------------- comparing two implementations
#
# Two correct implementations of this chain differ in three ways, each with a
# stated bound (used by tests/test_unfused_minimax.py and the bench's guard):
#
# 1. normed values in the last f32 bits (sum-of-squares order, rsqrt rounding):
#    x_scale differs by a few f32 ulps, and an FP8 value whose quotient lies
#    within those bits of a rounding midpoint lands on the neighbouring FP8 code
#    (rare: about 1 in 10^5 elements). A flip moves qkv[t, r] by exactly
#    |dx8[t, k]| * |w[r, k]| * x_scale[t] * s_qkv[r]: summed over k this is the
#    "flips" term of the bound, computed from the two x8 tensors.
# 2. the GEMM's f32 accumulation order: |d tot| <= c * sum_k |x8 * w| (the
#    standard dot-product error bound, c about n * 2^-24 worst case, far less in
#    practice; FP8 tensor-core accumulation keeps fewer bits). A value whose
#    dot product cancels to near zero can therefore differ by many bf16 ulps
#    while being as accurate as the inputs allow: ulps alone is no test.
# 3. the final bf16 rounding: 1 ulp (2 with an x_scale difference).
#
# Allowed |a - b| = ulps * ulp_bf16(max(|a|, |b|)) + rel_acc * terms + flips.


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at |x| (f32 tensor): 2^(e - 8) for |x| in
    [2^(e-1), 2^e); at least the smallest bf16 subnormal."""
    x = x.float().abs()
    _, e = torch.frexp(x)
    ulp = torch.ldexp(torch.ones_like(x), e - 8).clamp_min(2.0**-133)
    return torch.where(x == 0, torch.full_like(x, 2.0**-133), ulp)


def _fp8_code_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance between FP8 tensors in codes (adjacent values differ by 1),
    via the sign-magnitude byte mapped to ordered integers."""

    def ordered(x):
        u = x.view(torch.uint8).to(torch.int32)
        return torch.where(u >= 128, -(u & 0x7F), u)

    return (ordered(a) - ordered(b)).abs()


def compare_quant(x8_a, xs_a, x8_b, xs_b) -> dict:
    """Statistics of two per-token FP8 quantizations (CPU tensors): the
    largest relative x_scale difference, the number of differing FP8 values
    and the largest code distance among them."""
    xs_a, xs_b = xs_a.float().reshape(-1).cpu(), xs_b.float().reshape(-1).cpu()
    rel = ((xs_a - xs_b).abs() / xs_b.abs().clamp_min(1e-30)).max().item()
    dist = _fp8_code_distance(x8_a.cpu(), x8_b.cpu())
    return {
        "x_scale_max_rel": rel,
        "x8_flips": int((dist > 0).sum().item()),
        "x8_max_code_distance": int(dist.max().item()),
        "x8_values": dist.numel(),
    }


def compare_qkv(qkv_a, x8_a, xs_a, qkv_b, x8_b, xs_b, w, s_qkv, ulps: int = 2,
                rel_acc: float = 2.0**-12) -> dict:
    """Compare two qkv results ``[S, N]`` (bf16, or f32 holding bf16 values)
    given the FP8 rows and scales each was computed from and the logical
    weight ``w [N, K]`` with its scales (all moved to the CPU). Returns a dict:
    ``ok`` (every element within the allowed error above), ``worst`` (largest
    |a - b| / allowed), ``max_ulp``, ``frac_le1`` / ``frac_le2`` (fractions of
    values within 1 / 2 bf16 ulps), ``n_over`` (elements over the bound) and
    ``not_bf16`` (values that are not bf16 numbers: never ok)."""
    a, b = qkv_a.float().cpu(), qkv_b.float().cpu()
    wa = w.float().cpu().abs()
    s = s_qkv.float().cpu().reshape(1, -1)
    xs = torch.maximum(xs_a.float().reshape(-1, 1).cpu(), xs_b.float().reshape(-1, 1).cpu())
    terms = (x8_a.float().cpu().abs() @ wa.T) * xs * s
    flips = ((x8_a.float().cpu() - x8_b.float().cpu()).abs() @ wa.T) * xs * s
    allowed = ulps * bf16_ulp(torch.maximum(a.abs(), b.abs())) + rel_acc * terms + flips
    d = (a - b).abs()
    not_bf16 = int(((a.bfloat16().float() != a) & ~a.isnan()).sum() + ((b.bfloat16().float() != b) & ~b.isnan()).sum())
    u = bf16_ulp_diff(a.bfloat16(), b.bfloat16())
    over = ~(d <= allowed)  # NaN counts as over
    return {
        "ok": not bool(over.any()) and not_bf16 == 0,
        "n_over": int(over.sum().item()),
        "not_bf16": not_bf16,
        "worst": float((d / allowed).max().item()),
        "max_ulp": int(u.max().item()),
        "frac_le1": float((u <= 1).float().mean().item()),
        "frac_le2": float((u <= 2).float().mean().item()),
    }
