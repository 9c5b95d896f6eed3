"""PyTorch reference of the DeepSeek-V4.1 attention front (K1 ``attn_front``,
CONTRACTS.md B and C.2): the unfused path, rounding for rounding.

    x ─ mxfp8 ─ wqkv_a GEMV (two K halves) ─ bf16 ─┬─ q_norm ─ bf16 ─ mxfp8 ─ wq_b GEMV ─ bf16 ─ GPT-J RoPE ─ q
                                                   └─ kv_norm ─ bf16 ─ GPT-J RoPE ─ bf16 ─ fp8_ds_mla record
    pos, slot, topk, swa_idx ─ key table ─ KT, KLEN

Exact (bit for bit): :func:`mxfp8_quantize` (B.4), :func:`front_norms` in the
kernel's documented reduction order given the same bf16 qkv values,
:func:`kv_record` given the same kv values, :func:`key_table`. Tolerance-
compared: the two GEMVs (:func:`mx_gemv` is the exact dot product; the kernel
sums MMA results in its own order, see :func:`mx_gemv_kernel_order`).

All functions take and return CPU tensors; S = token rows. ``target`` picks
the FP8 flavour (OCP e4m3fn on gfx950 / sm90, FNUZ on gfx942) and with it
the MX maximum (448 / 224: :func:`codegen.stages.mxfp8_quant.mx_fp8_max`)."""

from __future__ import annotations

import torch

from codegen.fp import bf16_rn, fp8_dtype, sqrt_f32
from codegen.stages.mxfp8_quant import mx_fp8_max
from codegen.targets import Target, get_target

HIDDEN = 5120
Q_RANK = 1280  # q_lora_rank
KV_DIM = 512
QKV_ROWS = Q_RANK + KV_DIM  # wqkv = [wq_a; wkv]
HEAD_DIM = 512
NOPE = 448  # dims 0..447 of a head / of kv: no RoPE, fp8 in the record
ROPE_DIM = 64  # dims 448..511: GPT-J (interleaved pair) RoPE
HALF = ROPE_DIM // 2
N_HEADS = 64
WINDOW = 128
TOPK = 512
KEYS = TOPK + WINDOW
EPS = 1e-20  # q_norm and kv_norm
MX_BLOCK = 32
FLT_MIN = 1.1754943508222875e-38
RECORD_FLOOR = 1e-4  # amax floor of a record's 64-dim NoPE block
RECORD_BLOCK = 64
RECORD_BLOCKS = NOPE // RECORD_BLOCK  # 7 UE8M0 codes
RECORD_DATA = NOPE + 2 * ROPE_DIM  # 576: 448 fp8 + 64 bf16
RECORD_SCALE = 8  # 7 codes + 1 pad byte
COMPRESSED = -(2**31)  # bit 31 of a key-table entry: a compressed-cache slot

# the kernel's norm layout (B.5.3): 256 threads, q columns 8tt.., kv columns 2tt..
NORM_THREADS = 256
Q_PER_THREAD = 8
KV_PER_THREAD = 2
GROUP = 32  # lanes of one butterfly group (a warp on sm90, half a wave on AMD)

__all__ = [
    "ceil_exp", "mx_code", "mx_mul", "e8m0_scale", "mxfp8_quantize", "mxfp8_dequantize",
    "mx_gemv", "mx_gemv_kernel_order", "front_norms", "gptj_rope", "q_rope", "kv_rope",
    "kv_record", "insert_records", "key_table", "attn_front", "local_heads", "low_word",
]


def _target(target: Target | str) -> Target:
    return get_target(target) if isinstance(target, str) else target


def local_heads(tp: int) -> int:
    """q heads of one rank: 64 / TP (TP2 -> 32, TP4 -> 16)."""
    if tp not in (2, 4):
        raise ValueError(f"tp must be 2 or 4, got {tp}")
    return N_HEADS // tp


def low_word(x: torch.Tensor) -> torch.Tensor:
    """The low 32-bit word of int64 values as int32 (what the kernel reads of pos / slot)."""
    return ((x.to(torch.int64) + 2**31) % 2**32 - 2**31).to(torch.int32)


# ---------------------------------------------------------------------------------- MXFP8


def ceil_exp(v: torch.Tensor) -> torch.Tensor:
    """int32: the biased exponent field of f32 ``v``, +1 if any mantissa bit is set
    (= ceil(log2 v) + 127 for normal v >= 0; 1 for any positive subnormal)."""
    bits = v.float().contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def mx_code(amax: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """B.4: ``clamp(ceil_exp(RN(max(amax, FLT_MIN) / fp8_max)), 0, 254)`` (int32).
    An all-zero block gives code 1 (FLT_MIN / fp8_max is subnormal)."""
    a = torch.maximum(amax.float(), torch.tensor(FLT_MIN, dtype=torch.float32))
    qd = a / torch.tensor(fp8_max, dtype=torch.float32)  # IEEE f32 division
    return ceil_exp(qd).clamp(0, 254)


def mx_mul(code: torch.Tensor) -> torch.Tensor:
    """The quantizer's multiplier 2^(127 - code): f32 with bits (254 - code) << 23."""
    return ((254 - code.to(torch.int32)) << 23).contiguous().view(torch.float32)


def e8m0_scale(code: torch.Tensor) -> torch.Tensor:
    """2^(code - 127) as f32, exactly (code 0: the subnormal 2^-127)."""
    return torch.ldexp(torch.ones(code.shape, dtype=torch.float64), code.to(torch.float64) - 127).float()


def mxfp8_quantize(x: torch.Tensor, target: Target | str) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``mxfp8_quantize`` (B.4) along the last dim of ``x`` (bf16 or f32
    values): per 32-block ``code = mx_code(amax)``, ``byte = fp8(clamp(v *
    mx_mul(code), +-FP8_MAX))`` (one f32 multiply, RNE conversion to the
    target's flavour). Returns ``(bytes [.., K] fp8, codes [.., K/32] int32)``."""
    t = _target(target)
    m = mx_fp8_max(t)
    k = x.shape[-1]
    if k % MX_BLOCK:
        raise ValueError(f"mxfp8_quantize: last dim {k} is not a multiple of {MX_BLOCK}")
    v = x.float().reshape(*x.shape[:-1], k // MX_BLOCK, MX_BLOCK)
    code = mx_code(v.abs().amax(-1), m)
    y = (v * mx_mul(code)[..., None]).clamp(-m, m)
    return y.to(fp8_dtype(t)).reshape(x.shape), code


def mxfp8_dequantize(q: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """f64 values ``f(q) * 2^(code - 127)`` (exact) of MXFP8 ``q [.., K]`` with
    codes ``[.., K/32]``."""
    k = q.shape[-1]
    v = q.double().reshape(*q.shape[:-1], k // MX_BLOCK, MX_BLOCK)
    return (v * torch.ldexp(torch.ones((), dtype=torch.float64), code.double() - 127)[..., None]).reshape(q.shape)


def _dequant_weight(w: torch.Tensor, w_codes: torch.Tensor) -> torch.Tensor:
    """f64 [N, K] of an fp8 weight with E8M0 codes per 32x32 block ``[N/32, K/32]``."""
    n, k = w.shape
    sc = torch.ldexp(torch.ones((), dtype=torch.float64), w_codes.to(torch.float64) - 127)
    sc = sc.repeat_interleave(MX_BLOCK, 0).repeat_interleave(MX_BLOCK, 1)
    return w.double() * sc[:n, :k]


def mx_gemv(
    x8: torch.Tensor, x_codes: torch.Tensor, w: torch.Tensor, w_codes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact MXFP8 dot products ``out[t, r] = sum_k xd[t, k] * wd[r, k]``
    (f64; every term is an 8-bit product times a power of two, so this is exact
    up to f64 rounding of the sum, far below f32), with ``absdot = sum_k |xd wd|``
    (the scale of the rounding error any f32 order may make). ``w`` is the
    LOGICAL (unshuffled) [N, K] weight, ``w_codes`` [N/32, K/32] uint8/int.
    Returns ``(out [S, N] f64, absdot [S, N] f64)``."""
    xd = mxfp8_dequantize(x8, x_codes.to(torch.int32))
    wd = _dequant_weight(w, w_codes)
    return xd @ wd.T, xd.abs() @ wd.abs().T


def mx_gemv_kernel_order(
    x8: torch.Tensor, x_codes: torch.Tensor, w: torch.Tensor, w_codes: torch.Tensor,
    waves: int, k_chunk: int,
) -> torch.Tensor:
    """The kernel's f32 summation order over the MMA results, assuming each
    32-block's MMA result ``d`` is its exact dot rounded once to f32 (the
    hardware's internal order is not specified; this is then bit-exact): per
    warp w, chunks ``c = w, w + waves, ...`` (``k_chunk`` = 32 on sm90, 64 = two
    blocks on AMD) in order, blocks inside a chunk in k order, ``acc = fma(d,
    sx * sw, acc)`` (f32: ``sx * sw`` rounded, a power of two; the fma's exact
    product and one rounding: the same bits as ``acc + (d * sx) * sw`` unless a
    product leaves f32's normal range); then the warps' partials added in warp
    order starting from 0.0. Returns f32 [S, N]."""
    s, k = x8.shape
    n = w.shape[0]
    nb = k // MX_BLOCK
    xb = x8.double().reshape(s, nb, MX_BLOCK)
    wb = w.double().reshape(n, nb, MX_BLOCK)
    d = torch.einsum("sbk,nbk->snb", xb, wb).float()  # [S, N, blocks]: each block's dot, rounded once
    sx = e8m0_scale(x_codes.to(torch.int32))  # [S, nb]
    sw = e8m0_scale(w_codes.to(torch.int32)).repeat_interleave(MX_BLOCK, 0)[:n]  # [N, nb]
    per_chunk = k_chunk // MX_BLOCK
    chunks = nb // per_chunk
    total = torch.zeros(s, n, dtype=torch.float32)
    for wave in range(waves):
        acc = torch.zeros(s, n, dtype=torch.float32)
        for c in range(wave, chunks, waves):
            for b in range(c * per_chunk, (c + 1) * per_chunk):
                sxw = sx[:, None, b] * sw[None, :, b]  # f32, rounded
                # f32 + an exact product, summed in f64 and rounded once: the fma (53 >= 2 * 24 + 2)
                acc = (acc.double() + d[:, :, b].double() * sxw.double()).float()
        total = total + acc
    return total


def qkv_of_partials(parts: torch.Tensor) -> torch.Tensor:
    """B.5.2's ``qkv = bf16(P_0 + P_1)`` from the wqkv GEMV's f32 partials ``[P, S, N]`` of P
    equal K parts, in the kernel's order: two halves ``P_0 + P_1``; four quarters ``(P_0 + P_1) +
    (P_2 + P_3)`` (each half's partial the f32 sum of its quarters: the partials' order is the
    GEMV's, tolerance-compared). Returns f32 holding bf16 values."""
    if parts.shape[0] == 2:
        return bf16_rn(parts[0] + parts[1])
    if parts.shape[0] == 4:
        return bf16_rn((parts[0] + parts[1]) + (parts[2] + parts[3]))
    raise ValueError(f"qkv_of_partials: 2 or 4 K parts expected, got {parts.shape[0]}")


# ---------------------------------------------------------------------------------- norms


def _butterfly(v: torch.Tensor) -> torch.Tensor:
    """xor butterfly over the last dim (32 lanes), offsets 16, 8, 4, 2, 1
    (``s = s + s[lane ^ off]``, f32): every lane ends with the same value."""
    lanes = torch.arange(v.shape[-1])
    for off in (16, 8, 4, 2, 1):
        v = v + v[..., lanes ^ off]
    return v


def _tree8(g: torch.Tensor) -> torch.Tensor:
    """The 8 group sums ``[.., 8]`` added as ((G0+G1)+(G2+G3))+((G4+G5)+(G6+G7))."""
    return ((g[..., 0] + g[..., 1]) + (g[..., 2] + g[..., 3])) + ((g[..., 4] + g[..., 5]) + (g[..., 6] + g[..., 7]))


def _rsq(x: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(x), each correctly rounded (sm90's rsq; AMD's v_rsq_f32 is ~1 ulp)."""
    return torch.ones_like(x) / sqrt_f32(x)


def _sum_squares(v: torch.Tensor, per_thread: int) -> torch.Tensor:
    """The kernel's sum of squares of rows ``v [S, per_thread * n]`` (n <= 256):
    thread tt's ``s = v0*v0; s = s + vj*vj`` (plain f32 mul then add, j in
    order), threads 256 wide with zeros past n, each 32-lane group
    butterflied 16..1, the 8 group sums added as :func:`_tree8`."""
    s_rows = v.shape[0]
    p = v.reshape(s_rows, -1, per_thread)
    acc = p[..., 0] * p[..., 0]
    for j in range(1, per_thread):
        acc = acc + p[..., j] * p[..., j]
    lanes = torch.zeros(s_rows, NORM_THREADS, dtype=torch.float32)
    lanes[:, : acc.shape[1]] = acc
    groups = _butterfly(lanes.reshape(s_rows, NORM_THREADS // GROUP, GROUP))[..., 0]
    return _tree8(groups)


def front_norms(qkv: torch.Tensor, qn_w: torch.Tensor, kvn_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """B.5.3 on bf16 qkv values ``[S, 1792]`` (f32 holding bf16, the two K
    halves' partials already summed and rounded): plain RMSNorm with weight
    ``w`` (not 1 + w), eps 1e-20, ``r = rsq(RN(ssq / N) + eps)`` (IEEE division,
    correctly rounded rsq), ``bf16((x * r) * f32(w))``. Returns
    ``(ys [S, 1280], kn [S, 512])`` f32 holding bf16 values."""
    if qkv.dim() != 2 or qkv.shape[1] != QKV_ROWS:
        raise ValueError(f"front_norms: expected [S, {QKV_ROWS}], got {tuple(qkv.shape)}")
    v = qkv.float()
    xq, xk = v[:, :Q_RANK], v[:, Q_RANK:]
    eps = torch.tensor(EPS, dtype=torch.float32)
    tq = _sum_squares(xq, Q_PER_THREAD)
    tk = _sum_squares(xk, KV_PER_THREAD)
    rq = _rsq(tq / torch.tensor(float(Q_RANK)) + eps)
    rk = _rsq(tk / torch.tensor(float(KV_DIM)) + eps)
    ys = bf16_rn((xq * rq[:, None]) * qn_w.float()[None, :])
    kn = bf16_rn((xk * rk[:, None]) * kvn_w.float()[None, :])
    return ys, kn


# ---------------------------------------------------------------------------------- RoPE


def gptj_rope(v: torch.Tensor, pos: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """GPT-J (interleaved pair) RoPE of the last 64 dims of ``v [S, .., D]``
    (f32 values): pair j = dims (D-64+2j, D-63+2j), ``c = cos_sin[pos, j]``,
    ``s = cos_sin[pos, 32 + j]``, ``e0 = v0*c - v1*s``, ``e1 = v0*s + v1*c``
    (separate f32 multiplies and add/sub, no fma), NOT rounded; dims before
    are returned as they are."""
    p = low_word(pos).long()
    cs = cos_sin.float()[p]  # [S, 64]
    c, s = cs[:, :HALF], cs[:, HALF:]
    shape = (v.shape[0],) + (1,) * (v.dim() - 2) + (HALF,)
    c, s = c.reshape(shape), s.reshape(shape)
    out = v.float().clone()
    v0 = out[..., -ROPE_DIM::2].clone()
    v1 = out[..., -ROPE_DIM + 1::2].clone()
    out[..., -ROPE_DIM::2] = v0 * c - v1 * s
    out[..., -ROPE_DIM + 1::2] = v0 * s + v1 * c
    return out


def kv_rope(kn: torch.Tensor, pos: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """kv_norm output ``[S, 512]`` (bf16 values) -> RoPE of dims 448.. -> bf16 (B.5.3)."""
    return bf16_rn(gptj_rope(kn, pos, cos_sin))


def q_rope(q: torch.Tensor, pos: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """wq_b output ``[S, H, 512]`` (bf16 values) -> RoPE of each head's dims
    448.. -> bf16 (B.5.5)."""
    return bf16_rn(gptj_rope(q, pos, cos_sin))


# ---------------------------------------------------------------------------------- record


def kv_record(e: torch.Tensor, target: Target | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp8_ds_mla record of roped kv rows ``e [S, 512]`` (bf16 values),
    B.5.4: per 64-dim NoPE block ``rcode = ceil_exp(RN(max(amax, 1e-4) /
    FP8_MAX))`` (the target's MX maximum), bytes ``fp8(clamp(e * 2^(127 -
    rcode), +-FP8_MAX))``; RoPE dims as bf16. Returns ``(data [S, 576] uint8,
    scale [S, 8] uint8)`` (7 codes, then a 0 pad byte)."""
    t = _target(target)
    m = mx_fp8_max(t)
    s_rows = e.shape[0]
    nope = e.float()[:, :NOPE].reshape(s_rows, RECORD_BLOCKS, RECORD_BLOCK)
    amax = torch.maximum(nope.abs().amax(-1), torch.tensor(RECORD_FLOOR, dtype=torch.float32))
    rcode = ceil_exp(amax / torch.tensor(m, dtype=torch.float32))
    q = (nope * mx_mul(rcode)[..., None]).clamp(-m, m).to(fp8_dtype(t)).view(torch.uint8)
    rope = e.float()[:, NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    data = torch.cat([q.reshape(s_rows, NOPE), rope.reshape(s_rows, 2 * ROPE_DIM)], dim=1)
    scale = torch.zeros(s_rows, RECORD_SCALE, dtype=torch.uint8)
    scale[:, :RECORD_BLOCKS] = (rcode & 0xFF).to(torch.uint8)
    return data, scale


def insert_records(
    swa: torch.Tensor, slot: torch.Tensor, data: torch.Tensor, scale: torch.Tensor,
    swa_block: int, swa_stride: int,
) -> torch.Tensor:
    """A copy of the flat byte cache ``swa`` with token t's record written at
    ``slot[t]`` (low word; skipped when < 0): block ``sb = slot // swa_block``
    at byte ``sb * swa_stride``, data row ``(slot % swa_block) * 576``, scale
    row ``swa_block * 576 + (slot % swa_block) * 8``."""
    out = swa.clone()
    for t, sl in enumerate(low_word(slot).tolist()):
        if sl < 0:
            continue
        base = (sl // swa_block) * swa_stride
        so = sl % swa_block
        out[base + so * RECORD_DATA: base + (so + 1) * RECORD_DATA] = data[t]
        sc = base + swa_block * RECORD_DATA + so * RECORD_SCALE
        out[sc: sc + RECORD_SCALE] = scale[t]
    return out


# ---------------------------------------------------------------------------------- key table


def key_table(
    pos: torch.Tensor, slot: torch.Tensor, swa_idx: torch.Tensor, swa_lens: torch.Tensor,
    topk: torch.Tensor, t2r: torch.Tensor, comp_bt: torch.Tensor, comp_block: int, ratio: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """B.5.6 for S = len(pos) tokens. ``swa_idx [S, 1, 128]``, ``swa_lens [S]``,
    ``topk [S, 512]``, ``t2r [S]``, ``comp_bt [reqs, cols]`` (row stride = cols).
    KT[t, k]: the top-k compressed slot ``(comp_bt[req, local // comp_block] *
    comp_block + local % comp_block) | 1 << 31`` for k < ntopk (-1 for a
    negative local id), then the window slots for k < kv_len, then -1.
    ``ntopk = min((pos + 1) // ratio, 512)`` (0 for ratio 0 or a pad row,
    slot < 0); ``kv_len = ntopk + swa_lens`` (0 for a pad row). Integer
    arithmetic wraps at 32 bits like the kernel's. Returns
    ``(kt [S, 640] int32, klen [2S] int32)``: KLEN[t] = kv_len, KLEN[S + t] = ntopk."""
    s = pos.shape[0]
    p = low_word(pos).long()
    live = low_word(slot) >= 0
    nswa = torch.where(live, swa_lens[:s].long(), torch.zeros(s, dtype=torch.long))
    if ratio > 0:
        ntopk = torch.where(live, torch.clamp(torch.div(p + 1, ratio, rounding_mode="trunc"), max=TOPK),
                            torch.zeros(s, dtype=torch.long))
    else:
        ntopk = torch.zeros(s, dtype=torch.long)
    kv_len = ntopk + nswa
    k = torch.arange(KEYS)[None, :]
    widx = torch.clamp(k - ntopk[:, None], 0, WINDOW - 1)
    win = swa_idx.reshape(s, -1)[:, :WINDOW].long().gather(1, widx)
    kt = torch.where(k < kv_len[:, None], win, torch.full_like(win, -1))
    if ratio > 0:
        local = topk[:s].long()[:, torch.clamp(torch.arange(KEYS), max=TOPK - 1)]
        lc = torch.clamp(local, min=0)
        req = t2r[:s].long()
        cols = comp_bt.shape[1]
        flat = comp_bt.reshape(-1).long()
        idx = req[:, None] * cols + torch.div(lc, comp_block, rounding_mode="floor")
        use = (k < ntopk[:, None]) & (local >= 0)
        blk = torch.where(use, flat[torch.where(use, idx, torch.zeros_like(idx))], torch.zeros_like(idx))
        comp = (blk * comp_block + lc % comp_block) | (1 << 31)
        comp_val = torch.where(local >= 0, comp, torch.full_like(comp, -1))
        kt = torch.where(k < ntopk[:, None], comp_val, kt)
    kt32 = low_word(kt)
    klen = torch.cat([low_word(kv_len), low_word(ntopk)])
    return kt32, klen


# ---------------------------------------------------------------------------------- the chain


def attn_front(
    x: torch.Tensor, wqkv: torch.Tensor, wqkv_s: torch.Tensor, qn_w: torch.Tensor, kvn_w: torch.Tensor,
    wqb: torch.Tensor, wqb_s: torch.Tensor, cos_sin: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor,
    target: Target | str, heads: int,
) -> dict[str, torch.Tensor]:
    """The front of one layer (C.2), per token row of ``x [S, 5120]`` (bf16),
    with LOGICAL weights ``wqkv [1792, 5120]``, ``wqb [heads * 512, 1280]``
    (the target's fp8 dtype) and their E8M0 32x32 block codes:

        x8, sx  = mxfp8(x)                      qkv = bf16(f32(exact dot))
        ys, kn  = front_norms(qkv)              qx8, qs = mxfp8(ys)
        q       = q_rope(bf16(f32(exact dot of qx8 and wqb)))
        data, scale = kv_record(kv_rope(kn))

    Returns a dict: x8, x_codes, qkv, ys, kn, kv (roped), qx8, q_codes,
    q [S, heads, 512] (f32 of bf16), record_data, record_scale."""
    x8, sx = mxfp8_quantize(x, target)
    qkv = bf16_rn(mx_gemv(x8, sx, wqkv, wqkv_s)[0].float())
    ys, kn = front_norms(qkv, qn_w, kvn_w)
    qx8, qs = mxfp8_quantize(ys, target)
    qv = bf16_rn(mx_gemv(qx8, qs, wqb, wqb_s)[0].float()).reshape(x.shape[0], heads, HEAD_DIM)
    kv = kv_rope(kn, pos, cos_sin)
    data, scale = kv_record(kv, target)
    return {
        "x8": x8, "x_codes": sx, "qkv": qkv, "ys": ys, "kn": kn, "kv": kv, "qx8": qx8, "q_codes": qs,
        "q": q_rope(qv, pos, cos_sin), "record_data": data, "record_scale": scale,
    }
