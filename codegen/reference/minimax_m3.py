"""PyTorch reference of the first stages of the MiniMax-M3 K1 kernel
(unfused path, CONTRACTS.md A.5.1-A.5.3): residual add, gemma RMSNorm with the
kernel's exact sum-of-squares order, per-token FP8 quant, and the qkv GEMV.

Every function takes and returns torch tensors (CPU); S = number of token rows.
All arithmetic is f32 with the rounding stated per function unless noted."""

from __future__ import annotations

import torch

from codegen.fp import bf16_rn, fma_f32, fp8_dtype, sqrt_f32
from codegen.targets import Target, get_target

HIDDEN = 6144
QKV_ROWS = 2560  # qkv_rows(1): q(16) | k | v | one index-q | index-k heads of 128
HEAD_DIM = 128

LT_ELEMS = 8  # elements per logical thread
N_LT = HIDDEN // LT_ELEMS  # 768 logical threads
WARP = 32  # logical threads per logical warp (and slots of the second butterfly)
N_WARPS = N_LT // WARP  # 24
BUTTERFLY = (16, 8, 4, 2, 1)

__all__ = [
    "HIDDEN",
    "QKV_ROWS",
    "HEAD_DIM",
    "residual_add",
    "rms_sumsq",
    "rsq",
    "gemma_rmsnorm",
    "per_token_fp8",
    "norm_quant",
    "qkv_gemv",
    "pre_attn_front",
    "bf16_ulp_diff",
]


def _target(target: Target | str) -> Target:
    return get_target(target) if isinstance(target, str) else target


def _rows(x: torch.Tensor, what: str, width: int = HIDDEN) -> None:
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"{what}: expected [S, {width}], got {tuple(x.shape)}")


def residual_add(ar: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A.5.1: ``acc = f32(ar) + f32(res)`` (one f32 add, RNE) and
    ``h_out = bf16(acc)`` (RNE, bf16 dtype). Returns ``(acc [S, 6144] f32, h_out)``;
    the norm reads the unrounded ``acc``."""
    _rows(ar, "residual_add(ar)")
    _rows(res, "residual_add(res)")
    acc = ar.float() + res.float()
    return acc, acc.to(torch.bfloat16)


def _butterfly(s: torch.Tensor) -> torch.Tensor:
    """xor butterfly over the last dim (32 lanes), offsets 16, 8, 4, 2, 1:
    every lane does ``s = s + s[lane ^ off]`` (f32 add, RN)."""
    lanes = torch.arange(s.shape[-1])
    for off in BUTTERFLY:
        s = s + s[..., lanes ^ off]
    return s


def rms_sumsq(acc: torch.Tensor) -> torch.Tensor:
    """Per-row sum of squares ``[S]`` f32 in exactly the A.5.2 order:

    1. 768 logical threads (lt) of 8 consecutive elements: ``p = 0;
       p = fma(v_e, v_e, p)`` for e = 0..7 (each fma rounds once to f32);
    2. 24 logical warps of 32 lts: xor butterfly 16, 8, 4, 2, 1 (f32 adds);
    3. the 24 warp sums (lane 0) in slots 0..23 of 32 (24..31 = 0.0),
       butterflied again 16..1; the result is lane 0."""
    _rows(acc, "rms_sumsq")
    if acc.dtype != torch.float32:
        raise TypeError(f"rms_sumsq: acc must be float32, got {acc.dtype}")
    s_rows = acc.shape[0]
    v = acc.reshape(s_rows, N_LT, LT_ELEMS)
    p = torch.zeros(s_rows, N_LT, dtype=torch.float32)
    for e in range(LT_ELEMS):
        p = fma_f32(v[..., e], v[..., e], p)
    warp = _butterfly(p.reshape(s_rows, N_WARPS, WARP))[..., 0]  # [S, 24]
    slots = torch.zeros(s_rows, WARP, dtype=torch.float32)
    slots[:, :N_WARPS] = warp
    return _butterfly(slots)[:, 0].contiguous()


def rsq(x: torch.Tensor, mode: str = "ieee") -> torch.Tensor:
    """Reciprocal square root of f32 ``x``.

    ``"ieee"``: ``1.0 / sqrt(x)``, the sqrt and the division each correctly
    rounded in f32 (what the sm90 kernels compute; the sqrt is
    :func:`codegen.fp.sqrt_f32`, torch's CPU sqrt is not correctly rounded).
    ``"approx"``: AMD's hardware ``v_rsq_f32`` (~1 ulp) is not reproducible on
    the CPU; this returns the ieee value. AMD comparisons of rstd-dependent
    values (normed, x8, x_scale, qkv) must therefore feed the reference the
    kernel's own intermediates (contract Decision 5), not rely on this."""
    if mode not in ("ieee", "approx"):
        raise ValueError(f"rsq: mode must be 'ieee' or 'approx', got {mode!r}")
    x = x.float()
    return torch.ones_like(x) / sqrt_f32(x)


def gemma_rmsnorm(
    acc: torch.Tensor, g_in: torch.Tensor, eps: float, rsq_mode: str = "ieee"
) -> torch.Tensor:
    """A.5.2 gemma RMSNorm of f32 ``acc [S, 6144]`` (no bf16 rounding):
    ``tot`` = :func:`rms_sumsq`; ``rstd = rsq(tot / 6144 + eps)`` with an f32
    IEEE division then an f32 add (``eps`` rounded to f32 first);
    ``n = (acc * rstd) * (f32(g_in) + 1.0)``, f32 multiplies left to right."""
    tot = rms_sumsq(acc)
    mean = tot / torch.full_like(tot, float(HIDDEN))
    rstd = rsq(mean + torch.tensor(eps, dtype=torch.float32), rsq_mode)
    gain = g_in.float().reshape(1, HIDDEN) + torch.tensor(1.0, dtype=torch.float32)
    return (acc * rstd[:, None]) * gain


def per_token_fp8(
    normed: torch.Tensor, target: Target | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A.5.2 per-token FP8 quant of f32 ``normed [S, K]``:
    ``amax = max |n|`` per row; ``x_scale = 1.0 if amax == 0 else
    amax / FP8_MAX`` (f32 IEEE division, FP8_MAX = 240 FNUZ / 448 OCP by
    target); ``x8 = fp8(n / x_scale)``: f32 IEEE division (what the kernel's
    Markstein sequence reproduces), then RNE to the target's FP8 dtype, no
    clamp. Returns ``(x8 [S, K] fp8, x_scale [S] f32)``."""
    t = _target(target)
    if normed.dim() != 2:
        raise ValueError(f"per_token_fp8: expected [S, K], got {tuple(normed.shape)}")
    n = normed.float()
    amax = n.abs().amax(dim=1)
    x_scale = torch.where(
        amax == 0,
        torch.ones_like(amax),
        amax / torch.full_like(amax, t.fp8_max),
    )
    x8 = (n / x_scale[:, None]).to(fp8_dtype(t))
    return x8, x_scale


def norm_quant(
    ar: torch.Tensor,
    res: torch.Tensor,
    g_in: torch.Tensor,
    eps: float,
    target: Target | str,
    rsq_mode: str = "ieee",
) -> dict[str, torch.Tensor]:
    """Residual add + gemma RMSNorm + per-token FP8 (A.5.1-A.5.2).
    Returns ``dict(h_out bf16, normed f32, x8 fp8, x_scale f32)``."""
    acc, h_out = residual_add(ar, res)
    normed = gemma_rmsnorm(acc, g_in, eps, rsq_mode)
    x8, x_scale = per_token_fp8(normed, target)
    return {"h_out": h_out, "normed": normed, "x8": x8, "x_scale": x_scale}


def qkv_gemv(
    x8: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, s_qkv: torch.Tensor
) -> torch.Tensor:
    """A.5.3 qkv GEMV on the LOGICAL (unshuffled) fp8 weight ``w [N, K]``.

    ``tot[t, r] = sum_k f32(x8[t, k]) * f32(w[r, k])`` computed in f64 and
    rounded once to f32: every e4m3 product has <= 8 significant bits within
    2^-20..2^18, so the f64 sum of 6144 of them is exact (order-free) and this
    is the exactly rounded dot product. Then
    ``val = bf16((tot * x_scale[t]) * s_qkv[r])`` (f32 multiplies in that
    order, RNE to bf16). Returns ``[S, N]`` f32 holding bf16 values.

    The kernel accumulates in f32 in its MMA order, so its ``tot`` may differ
    from this one in the last f32 bits: compare qkv within 1 bf16 ulp
    (:func:`bf16_ulp_diff`)."""
    if x8.dim() != 2 or w.dim() != 2 or x8.shape[1] != w.shape[1]:
        raise ValueError(
            f"qkv_gemv: x8 {tuple(x8.shape)} and w {tuple(w.shape)} must be [S, K] and [N, K]"
        )
    tot = (x8.double() @ w.double().T).float()
    val = (tot * x_scale.float()[:, None]) * s_qkv.float()[None, :]
    return bf16_rn(val)


def pre_attn_front(
    ar: torch.Tensor,
    res: torch.Tensor,
    g_in: torch.Tensor,
    w: torch.Tensor,
    s_qkv: torch.Tensor,
    eps: float,
    target: Target | str,
    rsq_mode: str = "ieee",
) -> dict[str, torch.Tensor]:
    """A.5.1-A.5.3 in sequence (``w`` is the logical [N, 6144] fp8 weight).
    Returns ``dict(h_out bf16, x8 fp8, x_scale f32, qkv f32 of bf16 values)``."""
    nq = norm_quant(ar, res, g_in, eps, target, rsq_mode)
    qkv = qkv_gemv(nq["x8"], nq["x_scale"], w, s_qkv)
    return {"h_out": nq["h_out"], "x8": nq["x8"], "x_scale": nq["x_scale"], "qkv": qkv}


def bf16_ulp_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 ulps between two tensors of bf16 values (bf16 dtype or
    f32 holding bf16 values; ValueError otherwise), as an int32 tensor: the
    absolute difference of the sign-magnitude bit patterns mapped to ordered
    integers (+0 and -0 both map to 0; adjacent bf16 values differ by 1).
    NaNs are not meaningful."""

    def ordered(x: torch.Tensor) -> torch.Tensor:
        xb = x.to(torch.bfloat16)
        if x.dtype != torch.bfloat16:
            same = (xb.float() == x) | torch.isnan(x)
            if not bool(same.all()):
                raise ValueError("bf16_ulp_diff: input holds values that are not bf16")
        bits = xb.view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a) - ordered(b)).abs()


# ------------------------------------------------------------------ head tasks (A.5.4 - A.6)

ROTARY_DIM = 64  # partial NeoX RoPE over dims 0..63
HALF = ROTARY_DIM // 2
LOCAL_Q_HEADS = 16
K_OFF, V_OFF, IQ_OFF, IK_OFF = 2048, 2176, 2304, 2432  # rows of a token's qkv (one index head)
SPARSE_BLOCK = 128
PAGE16 = 16
PAGE_BYTES = 2048
HEAD_LANES, HEAD_ELEMS = 32, 4  # a token's lanes; dims per lane


def index_offsets(index_heads: int = 1, index_own: int = 0) -> tuple[int, int]:
    """Rows of the own index-q head and of index k in a token's qkv (A.2)."""
    return (LOCAL_Q_HEADS + 2 + index_own) * HEAD_DIM, (LOCAL_Q_HEADS + 2 + index_heads) * HEAD_DIM


def index_q_heads(qkv: torch.Tensor, g_iq, cos_sin, positions, eps: float, index_heads: int = 1) -> torch.Tensor:
    """Every index-q head of every token ``[S, heads, 128]`` as bf16 values (f32),
    made from qkv with the head math (all heads use g_iq)."""
    base = (LOCAL_Q_HEADS + 2) * HEAD_DIM
    return torch.stack([bf16_rn(head_norm_rope(qkv[:, base + h * HEAD_DIM: base + (h + 1) * HEAD_DIM].float(), g_iq,
                                               cos_sin, positions, eps)) for h in range(index_heads)], dim=1)


def head_norm_rope(e: torch.Tensor, gamma: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """One head of every token ``e [S, 128]`` (bf16 values as f32): gemma RMSNorm
    and partial NeoX RoPE in the kernel's order (A.5.4). Lane l holds dims
    4l..4l+3: ``ss = e0^2 + e1^2 + e2^2 + e3^2`` (plain f32 multiply and add,
    left to right from 0), butterfly 16..1 over the 32 lanes, ``rr = 1 /
    sqrt(ss / 128 + eps)`` (ieee), ``n = (e * rr) * (g + 1)``; dims < 64:
    ``fma(n, c, -(p * s))`` in the first half, ``fma(n, c, p * s)`` in the
    second, p the value 32 dims away, c / s from ``cos_sin[pos]``."""
    s_rows = e.shape[0]
    lanes = e.float().reshape(s_rows, HEAD_LANES, HEAD_ELEMS)
    ss = torch.zeros(s_rows, HEAD_LANES, dtype=torch.float32)
    for j in range(HEAD_ELEMS):
        ss = ss + lanes[..., j] * lanes[..., j]
    ss = _butterfly(ss)[:, :1]  # every lane equal
    rr = rsq(ss / torch.tensor(float(HEAD_DIM)) + torch.tensor(eps, dtype=torch.float32))
    n = (e.float() * rr) * (gamma.float() + 1.0)
    pos = positions.long() & 0xFFFFFFFF
    cs = cos_sin[pos].float()  # [S, 64]
    c, s = cs[:, :HALF], cs[:, HALF:]
    first, second = n[:, :HALF], n[:, HALF:ROTARY_DIM]
    out = n.clone()
    out[:, :HALF] = fma_f32(first, c, -(second * s))
    out[:, HALF:ROTARY_DIM] = fma_f32(second, c, first * s)
    return out


def kv_scale(x: torch.Tensor, fp8_max: float, static: bool) -> torch.Tensor:
    """Per-token scale ``[S]``: amax / FP8_MAX over the head (1.0 where amax is
    0), or 1.0 in static builds (Decision 1)."""
    if static:
        return torch.ones(x.shape[0], dtype=torch.float32)
    am = x.float().abs().amax(dim=1)
    return torch.where(am > 0, am / torch.tensor(fp8_max), torch.ones_like(am))


def page16_of(slot: torch.Tensor, page_stride: int) -> torch.Tensor:
    """Page-16 id of logical slots (Decision 1): slot // 16 when the views hold
    one side; blocks ``page_stride`` pages apart when K and V are packed."""
    if page_stride == SPARSE_BLOCK // PAGE16:
        return slot // PAGE16
    return (slot // SPARSE_BLOCK) * page_stride + (slot % SPARSE_BLOCK) // PAGE16


def heads(qkv: torch.Tensor, g_q, g_k, g_iq, g_ik, cos_sin, positions, slot_mapping, k_cache, v_cache, k_scale,
          v_scale, index_cache, eps: float, target: Target | str, static_kv_scale: bool = False,
          kv_page_stride: int = 16, index_heads: int = 1, index_own: int = 0) -> dict:
    """The head tasks given the kernel's own qkv ``[S, rows]`` (bf16 values as
    f32): q_out, iq_out, and copies of the caches and scale tensors with this
    step's rows written (A.5.4, A.6). Cache bytes are exact given qkv."""
    t = _target(target)
    fp8 = fp8_dtype(t)
    s_rows = qkv.shape[0]
    qkv = qkv.float()
    q = torch.stack([head_norm_rope(qkv[:, h * HEAD_DIM:(h + 1) * HEAD_DIM], g_q, cos_sin, positions, eps)
                     for h in range(LOCAL_Q_HEADS)], dim=1)
    k = head_norm_rope(qkv[:, K_OFF:K_OFF + HEAD_DIM], g_k, cos_sin, positions, eps)
    v = qkv[:, V_OFF:V_OFF + HEAD_DIM]
    iq_off, ik_off = index_offsets(index_heads, index_own)
    iq = head_norm_rope(qkv[:, iq_off:iq_off + HEAD_DIM], g_iq, cos_sin, positions, eps)
    ik = head_norm_rope(qkv[:, ik_off:ik_off + HEAD_DIM], g_ik, cos_sin, positions, eps)
    out = {
        "q_out": q.reshape(s_rows, LOCAL_Q_HEADS * HEAD_DIM).to(torch.bfloat16),
        "iq_out": iq.reshape(s_rows, 1, HEAD_DIM).to(torch.bfloat16),
        "k_cache": k_cache.clone(), "v_cache": v_cache.clone(), "k_scale": k_scale.clone(),
        "v_scale": v_scale.clone(), "index_cache": index_cache.clone(),
    }
    ks = kv_scale(k, t.fp8_max, static_kv_scale)
    vs = kv_scale(v, t.fp8_max, static_kv_scale)
    kb = (bf16_rn(k) / ks[:, None]).to(fp8).view(torch.uint8)  # [S, 128]
    vb = (v / vs[:, None]).to(fp8).view(torch.uint8)
    ib = bf16_rn(ik).to(fp8).view(torch.uint8)
    kc, vc = out["k_cache"].view(torch.uint8).view(-1), out["v_cache"].view(torch.uint8).view(-1)
    ic = out["index_cache"].view(torch.uint8).view(-1)
    ksc, vsc = out["k_scale"].view(-1), out["v_scale"].view(-1)
    d = torch.arange(HEAD_DIM)
    for tk in range(s_rows):
        slot = int(slot_mapping[tk]) & 0xFFFFFFFF
        slot = slot - (1 << 32) if slot >= 1 << 31 else slot  # the low word, signed
        if slot < 0:
            continue
        page = int(page16_of(torch.tensor(slot), kv_page_stride))
        tt = slot % PAGE16
        ksc[page * PAGE16 + tt] = ks[tk]
        vsc[page * PAGE16 + tt] = vs[tk]
        kc[page * PAGE_BYTES + (d // 16) * 256 + tt * 16 + d % 16] = kb[tk]
        vc[page * PAGE_BYTES + d * PAGE16 + tt] = vb[tk]
        ic[slot * HEAD_DIM + d] = ib[tk]
    return out


# ------------------------------------------------------------------ indexer block scores (A.9)

TOPK_BLOCKS = 16
SM_SCALE = 128 ** -0.5
LOG2E = 1.4426950408889634
ISCORE_STRIDE = 8192  # pairs per row


def score_scale(sm_scale: float = SM_SCALE) -> float:
    """``f32(f32(sm_scale) * f32(log2 e))``, applied after the max."""
    return float(torch.tensor(sm_scale, dtype=torch.float32) * torch.tensor(LOG2E, dtype=torch.float32))


def scored_blocks(seq: int, init_blocks: int = 0, local_blocks: int = 1, topk_blocks: int = TOPK_BLOCKS) -> range:
    """The blocks a request whose last row sees ``seq`` tokens scores: ``[init,
    n_blk - local)`` when its context spans more than ``topk_blocks`` blocks."""
    n_blk = -(-max(seq, 1) // SPARSE_BLOCK)
    return range(init_blocks, n_blk - local_blocks) if n_blk > topk_blocks else range(0)


INDEX_CP_FROM_BLOCKS = 288


def index_scores(iq: torch.Tensor, index_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 q_len: int, init_blocks: int = 0, local_blocks: int = 1, sm_scale: float = SM_SCALE,
                 topk_blocks: int = TOPK_BLOCKS, index_heads: int = 1, index_own: int = 0,
                 cp_from_blocks: int = INDEX_CP_FROM_BLOCKS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block scores of every row (A.9): ``(scores [S, 8192] f32, written [S,
    8192] bool, bound [S, 8192] f32)``. ``iq`` is ``[S, 128]`` (the own head)
    or ``[S, heads, 128]``. ``score = f32(max over the block's keys j < seq_k of
    dot(K_j, iq_k)) * f32(sm_scale * log2 e)`` (dots in float64, -inf where no
    key is in the row's context); requests are ``q_len`` consecutive rows, the
    last row's context and block table decide which blocks are scored. With 4
    index heads a request of more than ``cp_from_blocks`` blocks scores this
    rank's blocks ``first_own + 4 i`` for every head into pair ``h * 2048 + b
    // 4``. ``bound`` is the tolerance of a kernel with f32 accumulation: 2^-16
    of the scaled sum of |K_j| |q| over the dims."""
    s_rows = iq.shape[0]
    q_all = iq.float().double().reshape(s_rows, -1, HEAD_DIM)
    if q_all.shape[1] == 1 and index_heads > 1:
        raise ValueError("index_scores: pass every index head's q ([S, heads, 128]) with index_heads > 1")
    scale = score_scale(sm_scale)
    scores = torch.full((s_rows, ISCORE_STRIDE), float("nan"))
    written = torch.zeros(s_rows, ISCORE_STRIDE, dtype=torch.bool)
    bound = torch.zeros(s_rows, ISCORE_STRIDE)
    cache = index_cache.reshape(index_cache.shape[0], SPARSE_BLOCK, HEAD_DIM)  # converted after the gather
    for r in range(s_rows // q_len):
        last = r * q_len + q_len - 1
        n_blk = -(-max(int(seq_lens[last]), 1) // SPARSE_BLOCK)
        blocks = list(scored_blocks(int(seq_lens[last]), init_blocks, local_blocks, topk_blocks))
        long = index_heads > 1 and n_blk > cp_from_blocks
        if long:
            first = init_blocks + (index_own - init_blocks) % index_heads
            n_own = max(init_blocks + len(blocks) - first + index_heads - 1, 0) // index_heads
            blocks = [first + index_heads * i for i in range(n_own)]
        if not blocks:
            continue
        keys = cache[block_table[last, blocks].long()].float().double()  # [nb, 128, 128]
        pos = torch.tensor(blocks)[:, None] * SPARSE_BLOCK + torch.arange(SPARSE_BLOCK)[None, :]
        heads = list(range(index_heads)) if long else [index_own if q_all.shape[1] > 1 else 0]
        # every row and head of the request in one pass over its keys (a 1M-token context's are 1 GB
        # as float64): dots and magnitudes [nb, 128, rows * heads]
        q = q_all[r * q_len:last + 1, heads].reshape(-1, HEAD_DIM)
        all_dots = (keys @ q.T).view(len(blocks), SPARSE_BLOCK, q_len, len(heads))
        all_mags = (keys.abs_() @ q.abs().T).view(len(blocks), SPARSE_BLOCK, q_len, len(heads))
        for k in range(r * q_len, last + 1):
            live = pos < max(int(seq_lens[k]), 1)
            for i, h in enumerate(heads):
                dots, mags = all_dots[:, :, k - r * q_len, i], all_mags[:, :, k - r * q_len, i]  # [nb, 128]
                best = torch.where(live, dots, torch.tensor(float("-inf"), dtype=torch.float64)).amax(dim=1)
                cols = [h * (ISCORE_STRIDE // index_heads) + b // index_heads for b in blocks] if long else blocks
                scores[k, cols] = best.float() * torch.tensor(scale, dtype=torch.float32)
                written[k, cols] = True
                bound[k, cols] = (mags.amax(dim=1) * abs(scale) * 2.0 ** -16).float()
    return scores, written, bound
