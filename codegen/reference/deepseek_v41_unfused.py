"""The production-style UNFUSED PyTorch op chain that the DeepSeek-V4.1
``attn_front`` kernel replaces (contract C.2), written for speed on the GPU:
the peer the benchmarks time, eager and under ``torch.compile``.

    x8, sx  = mxfp8(x)                                   (B.4 bit rule, vectorized)
    qkv     = bf16(dequant(x8, sx) @ dequant(wqkv, wqkv_s)^T)        [S, 1792]
    ys      = bf16((q * rsqrt(mean(q^2) + 1e-20)) * qn_w)             q = qkv[:, :1280]
    kn      = bf16((kv * rsqrt(mean(kv^2) + 1e-20)) * kvn_w)          kv = qkv[:, 1280:]
    qx8, qs = mxfp8(ys)
    q       = rope(bf16(dequant(qx8, qs) @ dequant(wqb, wqb_s)^T))   [S, H, 512]
    kv_rot  = rope(kn);  record(kv_rot) inserted at slot (index_put_ into swa)
    KT, KLEN = the key table (B.5.6) with torch ops

``rope`` is GPT-J (interleaved pair) RoPE of dims 448..511 in f32 (separate
multiplies and add/sub), then bf16. Every step is plain torch ops, no host
synchronisation, no data-dependent shapes: the chain can be captured into a
CUDA graph and traced by ``torch.compile`` as one graph.

The GEMMs: torch has no MXFP8 (E8M0 per 1 x 32 / 32 x 32 block) GEMM on sm90
(``torch._scaled_mm`` takes MX block scales only on sm100+; its sm90 blockwise
modes are 1 x 128 / 128 x 128 with f32 scales, which cannot hold 32-wide
blocks). So each GEMM dequantizes both operands to bf16 (exact: an e4m3 value
times a power of two is a bf16 number) and runs a bf16 matmul whose
accumulation is f32 (cuBLAS; the bench turns off torch's
``allow_bf16_reduced_precision_reduction`` so that split-K partial sums stay
f32), rounding once to bf16: the contract's bf16(f32 dot) up to summation
order. The weights are dequantized on every call (they live in HBM as fp8 +
E8M0 codes, as in production): this chain reads ~5 bytes per weight element
(fp8 in, bf16 out and back in) where an MXFP8 GEMM reads 1.

Exactness (checked by :func:`compare_with_reference`, see its docstring): the
two MXFP8 quantizations, the record given the chain's own roped kv, its
insertion (every other byte of the cache untouched) and the key table are
bit-exact; the GEMMs and the norms (torch's ``mean`` / ``rsqrt``: another
order and rounding than the kernel's B.5.3) are tolerance-compared. The MX
scale code is computed without a division (the integer form of B.4 below), so
it stays exact under ``torch.compile`` too (Triton's f32 ``/`` is approximate
unless TORCHINDUCTOR_EMULATE_DIVISION_ROUNDING=1); inductor may contract the
RoPE's ``a * b - c * d`` into fmas (Triton's fp fusion), which moves roped
values by at most one bf16 ulp: the comparison allows that where asked."""

from __future__ import annotations

import math

import torch

from codegen.fp import bf16_rn
from codegen.reference import deepseek_v41 as ref
from codegen.reference.minimax_m3 import bf16_ulp_diff

__all__ = [
    "mx_code_int",
    "mxfp8_quantize_unfused",
    "e8m0_bf16",
    "mx_dequant",
    "mxfp8_gemm",
    "rms_norm_bf16",
    "rope_unfused",
    "kv_record_unfused",
    "insert_records_unfused",
    "key_table_unfused",
    "attn_front_unfused",
    "bf16_ulp",
    "compare_with_reference",
    "compare_qkv",
    "compare_q",
    "RECORD_BYTES",
]

RECORD_BYTES = ref.RECORD_DATA + ref.RECORD_SCALE  # 584
_MANT_075 = 0x600000  # mantissa field of 1.75


# ---------------------------------------------------------------------------------- MXFP8 (B.4)


def _fp8_max_log2(fp8_max: float) -> int:
    """k with fp8_max = 1.75 * 2^k (448: 8, 224: 7); ValueError otherwise."""
    m, e = math.frexp(float(fp8_max))
    if m != 0.875:
        raise ValueError(f"fp8_max must be 1.75 * 2^k (448, 224), got {fp8_max}")
    return e - 1


def mx_code_int(a: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """``ceil_exp(RN(a / fp8_max))`` (B.4) for f32 ``a >= 2^-126`` (finite), without a
    division: with ``a = f * 2^e`` (f in [1, 2)) and ``fp8_max = 1.75 * 2^k``,
    ``a / fp8_max <= 2^(e - k)`` iff ``f <= 1.75``, and ``RN(a / fp8_max) <= 2^E`` iff
    ``a <= fp8_max * 2^E`` (the f32 numbers between fp8_max * 2^E and its rounding
    midpoint: none, as 1.75 * 2^-24 < one f32 ulp of 1.75). So the code is
    ``bexp(a) - k + (mantissa(a) > 0.75)``, at least 1 (a subnormal quotient,
    as for FLT_MIN / fp8_max, has code 1). int32, the shape of ``a``."""
    k = _fp8_max_log2(fp8_max)
    bits = a.float().contiguous().view(torch.int32)
    code = ((bits >> 23) & 0xFF) - k + ((bits & 0x7FFFFF) > _MANT_075).to(torch.int32)
    return code.clamp(1, 254)


def _mx_mul(code: torch.Tensor) -> torch.Tensor:
    """2^(127 - code) as f32 (bits (254 - code) << 23)."""
    return ((254 - code) << 23).view(torch.float32)


def mxfp8_quantize_unfused(x: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """B.4 on ``x [S, K]`` (bf16 / f32 values) per 32-block of the last dim:
    ``code = ceil_exp(RN(max(amax, FLT_MIN) / fp8_max))``, bytes
    ``fp8(clamp(v * 2^(127 - code), +-fp8_max))``. Returns ``(x8 [S, K]
    fp8_dtype, codes [S, K/32] int32)``."""
    s, k = x.shape
    v = x.float().reshape(s, k // ref.MX_BLOCK, ref.MX_BLOCK)
    amax = v.abs().amax(-1).clamp_min(ref.FLT_MIN)
    code = mx_code_int(amax, fp8_max)
    y = (v * _mx_mul(code)[..., None]).clamp(-fp8_max, fp8_max)
    return y.to(fp8_dtype).reshape(s, k), code


def e8m0_bf16(code: torch.Tensor) -> torch.Tensor:
    """2^(code - 127) as bf16, exactly (code 0: 2^-127, a bf16 subnormal)."""
    c = code.to(torch.int32)
    f = (c << 23).view(torch.float32)
    return torch.where(c == 0, 2.0**-127, f).to(torch.bfloat16)


def mx_dequant(q: torch.Tensor, code: torch.Tensor, rows_per_code: int) -> torch.Tensor:
    """bf16 values of an MXFP8 tensor ``q [N, K]`` with E8M0 codes
    ``[N / rows_per_code, K / 32]`` (activations: 1, weights: 32 x 32 blocks).
    Exact (an e4m3 value times a power of two is a bf16 number, down to 2^-133)."""
    n, k = q.shape
    rb, kb = n // rows_per_code, k // ref.MX_BLOCK
    sc = e8m0_bf16(code).reshape(rb, 1, kb, 1)
    return (q.to(torch.bfloat16).reshape(rb, rows_per_code, kb, ref.MX_BLOCK) * sc).reshape(n, k)


def mxfp8_gemm(x8: torch.Tensor, x_codes: torch.Tensor, w: torch.Tensor, w_codes: torch.Tensor) -> torch.Tensor:
    """``bf16(dequant(x8) @ dequant(w)^T)``: ``x8 [S, K]`` with codes ``[S, K/32]``,
    the LOGICAL weight ``w [N, K]`` with 32 x 32 block codes ``[N/32, K/32]``;
    a bf16 matmul (f32 accumulation). Returns bf16 ``[S, N]``."""
    xd = mx_dequant(x8, x_codes, 1)
    wd = mx_dequant(w, w_codes, ref.MX_BLOCK)
    return xd @ wd.t()


# ---------------------------------------------------------------------------------- norms, RoPE


def rms_norm_bf16(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain RMSNorm in f32 (weight ``w``, not 1 + w): ``bf16((x * rsqrt(mean(x^2)
    + eps)) * f32(w))`` with torch's mean and rsqrt (FusedQKVRMSNorm's math)."""
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return ((xf * r) * w.float()).to(torch.bfloat16)


def rope_unfused(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J RoPE of the last 64 dims of bf16 ``v [..., 512]``: pair j = dims
    (448 + 2j, 449 + 2j), ``e0 = v0*c - v1*s``, ``e1 = v0*s + v1*c`` in f32 (no fma
    in eager), then bf16; dims 0..447 unchanged. ``cos`` / ``sin`` broadcast
    against ``[..., 32]``."""
    head = v[..., : ref.NOPE]
    r = v[..., ref.NOPE:].float()
    v0, v1 = r[..., 0::2], r[..., 1::2]
    e0 = v0 * cos - v1 * sin
    e1 = v0 * sin + v1 * cos
    rot = torch.stack([e0, e1], dim=-1).flatten(-2).to(torch.bfloat16)
    return torch.cat([head, rot], dim=-1)


def _low_word(x: torch.Tensor) -> torch.Tensor:
    """The low 32-bit word of int64 values, sign-extended, as int64 (the
    int64 -> int32 conversion truncates: two's complement on every backend)."""
    return x.to(torch.int32).to(torch.int64)


# ---------------------------------------------------------------------------------- the record


def kv_record_unfused(kv: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float) -> torch.Tensor:
    """The fp8_ds_mla record (B.5.4) of roped kv rows ``kv [S, 512]`` (bf16):
    ``[S, 584]`` uint8 = 448 NoPE fp8 bytes (per 64-block code
    ``ceil_exp(RN(max(amax, 1e-4) / fp8_max))``), the 64 RoPE dims as bf16
    (little-endian), 7 codes, a 0 pad byte. Integer byte assembly (no dtype
    views that change the element size)."""
    s = kv.shape[0]
    e = kv.float()
    nope = e[:, : ref.NOPE].reshape(s, ref.RECORD_BLOCKS, ref.RECORD_BLOCK)
    amax = nope.abs().amax(-1).clamp_min(ref.RECORD_FLOOR)
    rcode = mx_code_int(amax, fp8_max)
    q = (nope * _mx_mul(rcode)[..., None]).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    q = q.view(torch.uint8).reshape(s, ref.NOPE)
    rb = kv[:, ref.NOPE:].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    rope = torch.stack([rb & 0xFF, rb >> 8], dim=-1).reshape(s, 2 * ref.ROPE_DIM).to(torch.uint8)
    scale = torch.cat([rcode.to(torch.uint8), torch.zeros(s, 1, dtype=torch.uint8, device=kv.device)], dim=1)
    return torch.cat([q, rope, scale], dim=1)


def insert_records_unfused(swa: torch.Tensor, slot: torch.Tensor, rec: torch.Tensor, swa_block: int,
                           swa_stride: int) -> None:
    """Write each live token's record ``rec [S, 584]`` into the flat byte cache
    ``swa`` IN PLACE (one ``index_put_``): data row at ``sb * swa_stride +
    so * 576``, scale row at ``sb * swa_stride + swa_block * 576 + so * 8``
    (``sb, so = divmod(slot, swa_block)``, low word of ``slot``). Pad rows (slot
    < 0) must not write and the shapes must not depend on how many there are:
    they write the first live token's record at its own place (the same bytes
    twice), or, when no token is live, slot 0's current bytes back."""
    sl = _low_word(slot)
    live = sl >= 0
    slc = sl.clamp_min(0)
    base = (slc // swa_block) * swa_stride
    so = slc % swa_block
    dev = swa.device
    data = (base + so * ref.RECORD_DATA)[:, None] + torch.arange(ref.RECORD_DATA, device=dev)
    sc = (base + swa_block * ref.RECORD_DATA + so * ref.RECORD_SCALE)[:, None] + torch.arange(ref.RECORD_SCALE,
                                                                                              device=dev)
    idx = torch.cat([data, sc], dim=1)  # [S, 584]
    first = torch.argmax(live.to(torch.int32)).reshape(1)  # the first live row (0 if none)
    fill_idx = idx.index_select(0, first)
    fill_val = torch.where(live.index_select(0, first)[:, None], rec.index_select(0, first), swa[fill_idx])
    idx = torch.where(live[:, None], idx, fill_idx)
    val = torch.where(live[:, None], rec, fill_val)
    swa.index_put_((idx.reshape(-1),), val.reshape(-1))


# ---------------------------------------------------------------------------------- the key table


def key_table_unfused(pos, slot, swa_idx, swa_lens, topk, t2r, comp_bt, comp_block: int, ratio: int):
    """B.5.6 with device-side torch ops (the formulas of
    :func:`codegen.reference.deepseek_v41.key_table`). Returns ``(kt [S, 640]
    int32, klen [2S] int32)``."""
    s = pos.shape[0]
    dev = pos.device
    p = _low_word(pos)
    live = _low_word(slot) >= 0
    zero = torch.zeros_like(p)
    nswa = torch.where(live, swa_lens[:s].to(torch.int64), zero)
    if ratio > 0:
        ntopk = torch.where(live, torch.clamp(torch.div(p + 1, ratio, rounding_mode="trunc"), max=ref.TOPK), zero)
    else:
        ntopk = zero
    kv_len = ntopk + nswa
    k = torch.arange(ref.KEYS, device=dev)[None, :]
    widx = torch.clamp(k - ntopk[:, None], 0, ref.WINDOW - 1)
    win = swa_idx.reshape(s, -1)[:, : ref.WINDOW].to(torch.int64).gather(1, widx)
    kt = torch.where(k < kv_len[:, None], win, -1)
    if ratio > 0:
        cols = torch.clamp(torch.arange(ref.KEYS, device=dev), max=ref.TOPK - 1)
        local = topk[:s].to(torch.int64)[:, cols]
        lc = torch.clamp(local, min=0)
        flat = comp_bt.reshape(-1).to(torch.int64)
        idx = t2r[:s].to(torch.int64)[:, None] * comp_bt.shape[1] + torch.div(lc, comp_block, rounding_mode="floor")
        use = (k < ntopk[:, None]) & (local >= 0)
        blk = torch.where(use, flat[torch.where(use, idx, 0)], 0)
        comp = (blk * comp_block + lc % comp_block) | (1 << 31)
        comp_val = torch.where(local >= 0, comp, -1)
        kt = torch.where(k < ntopk[:, None], comp_val, kt)
    return kt.to(torch.int32), torch.cat([kv_len, ntopk]).to(torch.int32)


# ---------------------------------------------------------------------------------- the chain


def attn_front_unfused(
    x: torch.Tensor, wqkv: torch.Tensor, wqkv_s: torch.Tensor, qn_w: torch.Tensor, kvn_w: torch.Tensor,
    wqb: torch.Tensor, wqb_s: torch.Tensor, cos_sin: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor,
    swa: torch.Tensor, swa_idx: torch.Tensor, swa_lens: torch.Tensor, topk: torch.Tensor, t2r: torch.Tensor,
    comp_bt: torch.Tensor, *, swa_block: int, swa_stride: int, comp_block: int, ratio: int, heads: int,
    fp8_dtype: torch.dtype, fp8_max: float,
) -> dict[str, torch.Tensor]:
    """The unfused front (module docstring) of ``x [S, 5120]`` bf16 with the
    LOGICAL weights ``wqkv [1792, 5120]``, ``wqb [heads * 512, 1280]`` (fp8) and
    their 32 x 32 E8M0 codes (uint8). Writes the records into ``swa`` (flat
    uint8 cache) in place. ``fp8_max``: the MX maximum (448 OCP, 224 FNUZ).
    Returns a dict: q [S, heads, 512] bf16, kt [S, 640] int32, klen [2S] int32,
    and the intermediates the guard checks (materialized anyway or a few KB):
    x8, x_codes, qkv (bf16), ys, kn (bf16), kv (roped, bf16), qx8, q_codes."""
    s = x.shape[0]
    x8, sx = mxfp8_quantize_unfused(x, fp8_dtype, fp8_max)
    qkv = mxfp8_gemm(x8, sx, wqkv, wqkv_s)
    ys = rms_norm_bf16(qkv[:, : ref.Q_RANK], qn_w, ref.EPS)
    kn = rms_norm_bf16(qkv[:, ref.Q_RANK:], kvn_w, ref.EPS)
    qx8, qs = mxfp8_quantize_unfused(ys, fp8_dtype, fp8_max)
    qv = mxfp8_gemm(qx8, qs, wqb, wqb_s).reshape(s, heads, ref.HEAD_DIM)
    cs = cos_sin[_low_word(pos)]  # [S, 64] f32
    cos, sin = cs[:, : ref.HALF], cs[:, ref.HALF:]
    q = rope_unfused(qv, cos[:, None, :], sin[:, None, :])
    kv = rope_unfused(kn, cos, sin)
    insert_records_unfused(swa, slot, kv_record_unfused(kv, fp8_dtype, fp8_max), swa_block, swa_stride)
    kt, klen = key_table_unfused(pos, slot, swa_idx, swa_lens, topk, t2r, comp_bt, comp_block, ratio)
    return {"q": q, "kt": kt, "klen": klen, "x8": x8, "x_codes": sx, "qkv": qkv, "ys": ys, "kn": kn, "kv": kv,
            "qx8": qx8, "q_codes": qs}


# ---------------------------------------------------------------------------------- comparing
#
# The GEMMs are compared with the bound of any f32 summation order:
# |got - exact| <= ulps * ulp_bf16 + rel_acc * absdot, absdot = sum_k |x_k w_k|
# (the final bf16 rounding and the accumulation's rounding; values whose dot
# product cancels to near zero can be many ulps off and still as accurate as
# the inputs allow). Two implementations fed different (neighbouring) MXFP8
# inputs also differ by the exact effect of those inputs: the "flips" term
# sum_k |xa_k - xb_k| |w_k|.


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """bf16 ulp at |x| (f32), the smallest normal's below 2^-126."""
    return torch.ldexp(torch.ones_like(x.float()), torch.frexp(x.float().abs().clamp(min=2.0**-126))[1] - 8)


def _pair_max(t: torch.Tensor) -> torch.Tensor:
    """Max over each (even, odd) pair of the last dim, repeated back to both."""
    sh = t.shape
    return t.reshape(*sh[:-1], sh[-1] // 2, 2).amax(-1).repeat_interleave(2, -1)


def _stats(ok: bool, **kw) -> dict:
    return {"ok": bool(ok), **kw}


def compare_qkv(got, x8, x_codes, wqkv, wqkv_s, rel_acc: float, want=None, ulps: int = 1) -> dict:
    """qkv ``[S, 1792]`` (bf16 values) against the exact MXFP8 dot products of
    ``x8`` (or against ``want`` computed from the same x8, e.g. the kernel's,
    with ``ulps`` 2): within ``ulps`` bf16 ulps + ``rel_acc`` x absdot."""
    exact, absdot = ref.mx_gemv(x8.cpu(), x_codes.cpu(), wqkv.cpu(), wqkv_s.cpu())
    a = got.float().cpu()
    b = exact.float() if want is None else want.float().cpu()
    lim = ulps * bf16_ulp(torch.maximum(a.abs(), b.abs())) + rel_acc * absdot.float()
    d = (a - b).abs()
    over = ~(d <= lim)
    u = bf16_ulp_diff(a.bfloat16(), bf16_rn(b).bfloat16())
    return _stats(not over.any(), n_over=int(over.sum()), worst=float((d / lim).max()), max_ulp=int(u.max()),
                  frac_le1=float((u <= 1).float().mean()))


def compare_q(q_a, qx8_a, qs_a, q_b, qx8_b, qs_b, wqb, wqb_s, rel_acc: float) -> dict:
    """Two roped q results ``[S, H, 512]`` (bf16 values) from (possibly
    different) MXFP8 inputs ``qx8_a / qs_a`` and ``qx8_b / qs_b`` with the same
    logical ``wqb``: per element ``2 ulp(max |q|)`` + at NoPE dims ``d``, at RoPE
    dims ``2 (ulp(2 max|q| of the pair) + d of the pair)`` (the rotation adds
    both errors of a pair; |v| <= sqrt(2) max|q| of the pair), where ``d = rel_acc
    x absdot + flips``. Also the fraction within 2 ulps, over every token and over
    the tokens whose MXFP8 rows agree (``frac_le2_same_rows``; None if none do: a
    code flip moves every q value of its token)."""
    xa = ref.mxfp8_dequantize(qx8_a.cpu(), qs_a.cpu())
    xb = ref.mxfp8_dequantize(qx8_b.cpu(), qs_b.cpu())
    wd = ref._dequant_weight(wqb.cpu(), wqb_s.cpu()).abs()
    absdot = torch.maximum(xa.abs() @ wd.T, xb.abs() @ wd.T)
    flips = (xa - xb).abs() @ wd.T
    a, b = q_a.float().cpu(), q_b.float().cpu()
    shape = a.shape
    d = (rel_acc * absdot + flips).float().reshape(shape)
    m = torch.maximum(a.abs(), b.abs())
    rope = torch.arange(shape[-1]) >= ref.NOPE
    lim = 2 * bf16_ulp(m) + torch.where(rope, 2 * (bf16_ulp(2 * _pair_max(m)) + _pair_max(d)), d)
    err = (a - b).abs()
    over = ~(err <= lim)
    u = bf16_ulp_diff(a.bfloat16(), b.bfloat16())
    same = (xa == xb).all(-1)  # [S]: tokens whose rows agree
    return _stats(not over.any() and bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()),
                  n_over=int(over.sum()), worst=float((err / lim).max()), max_ulp=int(u.max()),
                  frac_le2=float((u <= 2).float().mean()),
                  frac_le2_same_rows=float((u[same] <= 2).float().mean()) if same.any() else None,
                  flips=int((xa != xb).sum()), rows_flipped=int((~same).sum()))


def compare_with_reference(out: dict, swa_after: torch.Tensor, inputs: dict, logical: dict, target, heads: int,
                           ratio: int, rel_acc: float, exact_rope: bool = True) -> dict[str, dict]:
    """Check the chain's outputs ``out`` (:func:`attn_front_unfused`) and the
    cache after it (``swa_after``; ``inputs["swa"]`` = before) against
    :mod:`codegen.reference.deepseek_v41`, each stage given the chain's own
    intermediates (CONTRACTS Decision 5). ``inputs`` / ``logical``: as
    ``tests/deepseek_case.Case``. Returns name -> stats with ``ok``:

    * x8_exact: X8 bytes and codes == mxfp8(x) (B.4, exact).
    * qkv_vs_exact: within 1 bf16 ulp + rel_acc x absdot of the exact dot products.
    * norms: ys / kn vs ``front_norms`` of the chain's qkv: at most 1 bf16 ulp
      apart (torch's mean / rsqrt round differently from the kernel's order:
      the contract leaves FusedQKVRMSNorm's order open), >= 98 % identical.
    * qx8_exact: QX8 bytes and codes == mxfp8(chain's ys).
    * kv_rope: the roped kv vs ``kv_rope`` of the chain's kn: NoPE dims exact,
      RoPE dims exact (``exact_rope``) or within 1 bf16 ulp (fma contraction
      under torch.compile).
    * swa_exact: the whole cache == the canaries with ``kv_record(chain's kv)``
      inserted at the live slots (records exact; pad rows and every other byte
      untouched).
    * q: within the bound of ``tests/deepseek_case.check`` (rel_acc for the
      accumulation) of the exact wq_b of the chain's own QX8, rounded and roped
      as the contract says.
    * kt_exact: KT / KLEN == ``key_table``."""
    o = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    r: dict[str, dict] = {}
    x8, sx = ref.mxfp8_quantize(inputs["x"], target)
    r["x8_exact"] = _stats(torch.equal(o["x8"].view(torch.uint8), x8.view(torch.uint8))
                           and torch.equal(o["x_codes"].to(torch.int32), sx),
                           bytes_differ=int((o["x8"].view(torch.uint8) != x8.view(torch.uint8)).sum()))
    r["qkv_vs_exact"] = compare_qkv(o["qkv"], x8, sx, logical["wqkv"], logical["wqkv_s"], rel_acc)

    ys, kn = ref.front_norms(o["qkv"].float(), inputs["qn_w"], inputs["kvn_w"])
    uy, uk = bf16_ulp_diff(o["ys"].float(), ys), bf16_ulp_diff(o["kn"].float(), kn)
    same = float(torch.cat([(uy == 0).flatten(), (uk == 0).flatten()]).float().mean())
    r["norms"] = _stats(int(uy.max()) <= 1 and int(uk.max()) <= 1 and same >= 0.98, max_ulp_ys=int(uy.max()),
                        max_ulp_kn=int(uk.max()), frac_identical=same)

    qx8, qs = ref.mxfp8_quantize(o["ys"].float(), target)
    r["qx8_exact"] = _stats(torch.equal(o["qx8"].view(torch.uint8), qx8.view(torch.uint8))
                            and torch.equal(o["q_codes"].to(torch.int32), qs),
                            bytes_differ=int((o["qx8"].view(torch.uint8) != qx8.view(torch.uint8)).sum()))

    kv_want = ref.kv_rope(o["kn"].float(), inputs["pos"], inputs["cos_sin"])
    u = bf16_ulp_diff(o["kv"].float(), kv_want)
    nope_ok = int(u[:, : ref.NOPE].max()) == 0
    rope_max = int(u[:, ref.NOPE:].max())
    r["kv_rope"] = _stats(nope_ok and rope_max <= (0 if exact_rope else 1), nope_exact=nope_ok, rope_max_ulp=rope_max,
                          rope_identical=float((u[:, ref.NOPE:] == 0).float().mean()))

    data, scale = ref.kv_record(o["kv"].float(), target)
    want_swa = ref.insert_records(inputs["swa"], inputs["slot"], data, scale, inputs["swa_block"],
                                  inputs["swa_stride"])
    bad = (swa_after.cpu() != want_swa).nonzero().flatten()
    r["swa_exact"] = _stats(bad.numel() == 0, bytes_differ=bad.numel(), first=bad[:8].tolist())

    exact, absdot = ref.mx_gemv(o["qx8"], o["q_codes"].to(torch.int32), logical["wqb"], logical["wqb_s"])
    s = o["q"].shape[0]
    v = bf16_rn(exact.float()).reshape(s, heads, ref.HEAD_DIM)
    q_ref = ref.q_rope(v, inputs["pos"], inputs["cos_sin"])
    qv = o["q"].float()
    d = (rel_acc * absdot).float().reshape(qv.shape)
    rope = torch.arange(ref.HEAD_DIM) >= ref.NOPE
    lim = bf16_ulp(q_ref) + torch.where(rope, 2 * (bf16_ulp(_pair_max(v.abs())) + _pair_max(d)), d)
    err = (qv - q_ref).abs()
    uq = bf16_ulp_diff(qv, q_ref)
    r["q"] = _stats(bool(torch.isfinite(qv).all()) and not bool((~(err <= lim)).any()),
                    n_over=int((~(err <= lim)).sum()), worst=float((err / lim).max()), max_ulp=int(uq.max()),
                    frac_identical=float((uq == 0).float().mean()))

    kt, klen = ref.key_table(inputs["pos"], inputs["slot"], inputs["swa_idx"], inputs["swa_lens"], inputs["topk"],
                             inputs["t2r"], inputs["comp_bt"], inputs["comp_block"], ratio)
    r["kt_exact"] = _stats(torch.equal(o["kt"], kt) and torch.equal(o["klen"], klen),
                           kt_differ=int((o["kt"] != kt).sum()), klen_differ=int((o["klen"] != klen).sum()))
    return r
