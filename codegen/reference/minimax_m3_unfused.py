"""The production-style UNFUSED PyTorch op chain that the MiniMax-M3 pre_attn
kernel (K1) replaces, contract C.1 steps 1-4, written for speed on the GPU: the
peer the benchmarks time, eager and under ``torch.compile``.

Steps 1-2 (:func:`pre_attn_unfused`):

    acc    = f32(ar) + f32(res)                      -> h_out = bf16(acc)
    normed = acc * rsqrt(mean(acc^2) + eps) * (1 + f32(g_in))      (f32)
    x_scale[t] = amax|normed[t]| / FP8_MAX (1.0 where amax == 0)   (f32, [S, 1])
    x8     = fp8(clamp(normed / x_scale, +-FP8_MAX))
    qkv    = bf16((x8 @ w^T) * x_scale * s_qkv)      (torch._scaled_mm, rowwise)

Step 3 (:func:`heads_unfused`, vLLM's ``fused_qknorm_idxrqknorm`` /
``fused_minimax_m3_qknorm_rope_kv_insert`` as torch ops, every head at once):
per-head gemma RMSNorm + partial NeoX RoPE of the 16 q heads, k, the index-q
heads and index k; q_out / iq_out (bf16); K (per-token scale) and V into the
page-16 SHUFFLE cache, their f32 scales, index K into the index cache
(``index_put_``; slots < 0 write nothing).

Step 4 (:func:`index_scores_unfused`, the decode indexer's block scores):
each request's blocks gathered through its last row's block table, dot
products with the bf16 index q in f32, keys >= the row's seq_len masked, max
per block, times ``f32(sm_scale * log2 e)``; written as (f32 value, tag)
pairs where the kernel writes them (contract A.9).

:func:`k1_unfused` runs the three in sequence: everything the kernel writes
(h_out, q_out, iq_out, the K / V / scale / index-cache bytes, iscore) and
nothing else; only the kernel's mailboxes (qkv pairs, x8) have no
counterpart. Every step is plain torch ops with no Python loop over tokens,
heads or blocks, no host synchronisation and no data-dependent shape: the
chain can be captured into a CUDA graph and traced by ``torch.compile``
(``dynamic=False``) as one graph. Shapes are fixed per case: the block table's
column count (ceil(max context / 128)) sets the scorer's work, and columns a
row does not score are computed and discarded (not written).

Exactness (contract C.1 classes). Steps 1-2 use torch's own ``mean`` and
``rsqrt`` (another summation order and rounding than A.5.2), so ``normed``
may differ from the contract's in the last f32 bits and an FP8 value lying on
a rounding boundary can land one FP8 step away; ``h_out`` is exact; qkv is
compared within a bound (below). Steps 3-4 follow the contract's order: given
the same qkv, q_out, iq_out and every cache and scale byte are exactly the
contract's (:func:`codegen.reference.minimax_m3.heads`): the per-lane sums of
squares and the 16..1 butterfly as slice adds (bf16 squares are exact in f32,
so an fma contraction cannot change them), ``1 / sqrt`` with the sqrt
correctly rounded (CPU: in f64, then rounded: torch's CPU f32 sqrt is not),
the RoPE's fma as one f64 multiply-add rounded to f32 (the f32 product is
exact in f64; wrong only when the f64 sum lies exactly on an f32 rounding
midpoint, about 2^-28 of values: the reference's ``fma_f32`` corrects that
with a host-side branch a captured graph cannot hold), IEEE f32 divisions
(under ``torch.compile`` done in f64 and rounded, the same value: Triton's f32
``/`` is approximate). iscore values are f32 dot products in the
implementation's order: within 2^-16 x sum|K||q| x scale of the float64
reference (:func:`codegen.reference.minimax_m3.index_scores`); which pairs are
written is exact.

The GEMM is ``torch._scaled_mm`` (FP8 tensor cores, rowwise scales;
torch's CUTLASS sm90 kernel's epilogue is ``(acc * scale_a) * scale_b`` then
bf16, the contract's order) where the device has one (CUDA sm89+, ROCm
gfx94x/gfx95x), else a dequantized f32 matmul. ``w_qkv_t`` is the logical
weight ``w [N, K]`` (row-major, one row per output channel) seen transposed:
``w.t()``, a ``[K, N]`` column-major view, the layout ``torch._scaled_mm``
wants for its second operand. Shapes the rowwise ``_scaled_mm`` needs (torch's
meta checks, ``_meta_registrations.py``): the first operand row-major with
K % 16 == 0, the second column-major with both dims % 16 == 0, ``scale_a``
[M, 1] and ``scale_b`` [1, N], f32, contiguous. M (the token count) needs no
padding (CUTLASS pads the scale itself); ``pad_m`` is there in case a backend
wants it."""

from __future__ import annotations

import torch

from codegen.reference import minimax_m3 as ref
from codegen.reference.minimax_m3 import bf16_ulp_diff

__all__ = [
    "GEMMS",
    "scaled_mm_available",
    "pick_gemm",
    "norm_quant_unfused",
    "fp8_gemm_rowwise",
    "pre_attn_unfused",
    "heads_unfused",
    "index_scores_unfused",
    "k1_unfused",
    "bf16_ulp",
    "compare_quant",
    "compare_qkv",
    "HEAD_OUTPUTS",
    "packed_kv",
    "compare_heads",
    "compare_head_outputs",
    "iscore_pairs",
    "compare_iscore",
    "score_delta_bound",
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


# ----------------------------------------------------------------- steps 3-4: head tasks, indexer scores

HEAD_DIM = ref.HEAD_DIM
Q_HEADS = ref.LOCAL_Q_HEADS
ROT = ref.ROTARY_DIM
HALF = ref.HALF
_SCORE_SCALES = {ref.SM_SCALE: ref.score_scale(ref.SM_SCALE)}  # f32(sm_scale * log2 e), computed outside a trace


def _div(a, b):
    """IEEE f32 ``a / b``. Eager torch divides correctly rounded (CPU, and
    CUDA when the divisor is a tensor on the device); Triton's f32 ``/`` is approximate (``div.full``) unless inductor's
    ``eager_numerics.division_rounding`` is set, so a traced graph divides in
    f64 and rounds to f32: the same value (f64 carries more than twice f32's
    precision, so the double rounding of a quotient is innocuous)."""
    if torch.compiler.is_compiling():
        bd = b.double() if isinstance(b, torch.Tensor) else float(b)
        ad = a.double() if isinstance(a, torch.Tensor) else float(a)
        return (ad / bd).float()
    if isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a.device.type != "cpu":
        # CUDA divides a tensor by a Python (CPU) scalar as a * (1 / b): up to an ulp off
        # (seen on the H200: 2 of 4 K scales at S = 4); a device tensor divides correctly
        b = torch.full((), b, dtype=a.dtype, device=a.device)
    return a / b


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded f32 sqrt: CUDA's f32 sqrt is (and Triton's
    ``sqrt_rn``); torch's CPU one is not, so the CPU takes the f64 sqrt (at
    most one f64 ulp off) and rounds: the sqrt of an f32 never lies within an
    f64 ulp of an f32 rounding midpoint, so that is the correctly rounded f32."""
    if x.device.type == "cpu":
        return torch.sqrt(x.double()).float()
    return torch.sqrt(x)


def _bf16_values(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to bf16 (RNE) as f32 values. Inductor elides a
    ``.to(bfloat16).float()`` pair inside a fused kernel (it computes low
    precision in f32 unless ``emulate_precision_casts``), so a traced graph
    rounds with integer ops on the f32 bits instead (the same values; inf
    stays inf, NaN is not expected)."""
    if torch.compiler.is_compiling():
        u = x.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return r.to(torch.int32).view(torch.float32)
    return x.float() if x.dtype == torch.bfloat16 else x.float().to(torch.bfloat16).float()


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` rounded once to f32 for f32 inputs: the product is exact
    in f64, the f64 sum rounds once, then to f32 (double rounding only when
    that sum lies exactly on an f32 midpoint; see the module docstring)."""
    return (a.double() * b.double() + c.double()).float()


def _put_rows(dst: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, src: torch.Tensor,
              any_live: torch.Tensor) -> None:
    """``dst.view(-1)[idx[t]] = val[t]`` for the live rows, IN PLACE, one
    ``index_put_``, shapes independent of how many rows are live: a pad row
    writes the first live row's values at that row's places (the same bytes
    twice: ``src`` maps each row to itself or to that row); when no row is
    live, every row writes the current bytes at row 0's places back."""
    flat = dst.view(-1)
    idx = idx.index_select(0, src)
    val = val.index_select(0, src)
    val = torch.where(any_live, val, flat[idx])
    flat.index_put_((idx.reshape(-1),), val.reshape(-1))


def heads_unfused(
    qkv: torch.Tensor, g_q: torch.Tensor, g_k: torch.Tensor, g_iq: torch.Tensor, g_ik: torch.Tensor,
    cos_sin: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor,
    v_cache: torch.Tensor | None, k_scale: torch.Tensor, v_scale: torch.Tensor, index_cache: torch.Tensor,
    eps: float, fp8_dtype: torch.dtype, fp8_max: float, *, static_kv_scale: bool = False, kv_page_stride: int = 16,
    index_heads: int = 1, index_own: int = 0, v_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract C.1 step 3 (A.5.4, A.6) on ``qkv [S, (19 + index_heads) * 128]``
    (bf16, or f32 holding bf16 values): every head of every token normed at
    once (the V and the other index-q heads too, whose results are dropped:
    one shape, no gather), the 64 RoPE dims rotated, then

    * ``q_out [S, 2048]`` and ``iq_out [S, 1, 128]`` (the own index head), bf16,
      returned;
    * K bytes ``fp8(bf16(k) / ks)`` and V bytes ``fp8(v / vs)`` (per-token
      scales ``amax / fp8_max``, 1.0 where amax is 0 or ``static_kv_scale``)
      into the page-16 SHUFFLE views ``k_cache`` / ``v_cache``, the scales into
      ``k_scale`` / ``v_scale`` ([pages, 16] f32), index-K bytes
      ``fp8(bf16(ik))`` into ``index_cache`` at ``slot * 128 + d``, IN PLACE,
      for tokens whose slot is >= 0.

    ``positions`` and ``slot_mapping`` are int64 and used as they are (the
    kernel reads their low words: the same values below 2^31).

    The caches are byte tensors (``torch.uint8`` views of the fp8 caches,
    contiguous). K and V sides packed in one allocation (vLLM's layout):
    pass ``v_cache=None`` and ``v_offset`` = where the V view starts in
    ``k_cache``'s bytes (8 pages): K and V bytes are then written through
    ``k_cache`` in one ``index_put_``. (Two views of one storage, both
    written, or two writes into one cache input make ``torch.compile`` copy
    the whole storage on every call.) Exactness: see
    the module docstring (equal to :func:`codegen.reference.minimax_m3.heads`)."""
    s = qkv.shape[0]
    dev = qkv.device
    nh = qkv.shape[1] // HEAD_DIM  # q(16) | k | v | index q (index_heads) | index k
    e = _bf16_values(qkv).reshape(s, nh, HEAD_DIM)
    gam = torch.cat([g_q.reshape(1, HEAD_DIM).expand(Q_HEADS, HEAD_DIM), g_k.reshape(1, HEAD_DIM).expand(2, HEAD_DIM),
                     g_iq.reshape(1, HEAD_DIM).expand(index_heads, HEAD_DIM), g_ik.reshape(1, HEAD_DIM)])
    gp1 = gam.float() + 1.0  # [nh, 128]

    # sum of squares: lane l holds dims 4l..4l+3 (plain multiply, add from the left); xor
    # butterfly 16..1 over the 32 lanes = halving adds (f32 addition commutes exactly)
    sq = (e * e).reshape(s, nh, ref.HEAD_LANES, ref.HEAD_ELEMS)
    ss = ((sq[..., 0] + sq[..., 1]) + sq[..., 2]) + sq[..., 3]  # [S, nh, 32]
    w = ref.HEAD_LANES // 2
    while w:
        ss = ss[..., :w] + ss[..., w:2 * w]
        w //= 2
    rr = _div(1.0, _sqrt(ss / float(HEAD_DIM) + eps))  # [S, nh, 1]
    n = (e * rr) * gp1

    # partial NeoX RoPE: fma(n, c, -(p * s)) in the first half, fma(n, c, p * s) in the second
    cs = cos_sin[positions].float()  # [S, 64]
    c = cs[:, None, None, :HALF]
    sn = cs[:, None, None, HALF:]
    nr = n[..., :ROT].reshape(s, nh, 2, HALF)
    ps = nr.flip(2) * sn  # the partner's value (32 dims away) times sin
    rot = _fma(nr, c, torch.cat([-ps[:, :, :1], ps[:, :, 1:]], dim=2))
    y = torch.cat([rot.reshape(s, nh, ROT), n[..., ROT:]], dim=2)  # [S, nh, 128] f32

    iq_h, ik_h = Q_HEADS + 2 + index_own, Q_HEADS + 2 + index_heads
    q_out = y[:, :Q_HEADS].reshape(s, Q_HEADS * HEAD_DIM).to(torch.bfloat16)
    iq_out = y[:, iq_h:iq_h + 1].to(torch.bfloat16)  # [S, 1, 128]

    # K (normed, roped, bf16-rounded) and V (raw GEMV values) with per-token scales
    k = y[:, Q_HEADS]
    v = e[:, Q_HEADS + 1]
    kv = torch.stack([_bf16_values(k), v], dim=1)  # [S, 2, 128], bf16 values
    if static_kv_scale:
        sc = torch.ones(s, 2, dtype=torch.float32, device=dev)
        kvb = kv.to(fp8_dtype)
    else:
        am = torch.stack([k.abs().amax(-1), v.abs().amax(-1)], dim=1)  # k's amax before the bf16 rounding
        sc = torch.where(am > 0, _div(am, fp8_max), 1.0)
        kvb = _div(kv, sc[..., None]).to(fp8_dtype)
    kvb = kvb.view(torch.uint8)
    ib = _bf16_values(y[:, ik_h]).to(fp8_dtype).view(torch.uint8)  # [S, 128]

    # addresses (A.6) and the writes; pad rows (slot < 0) write nothing
    slot = slot_mapping  # int64; the kernel reads the low word: the same values below 2^31
    live = slot >= 0
    sl = slot.clamp_min(0)
    if kv_page_stride == ref.SPARSE_BLOCK // ref.PAGE16:
        page = sl // ref.PAGE16
    else:
        page = (sl // ref.SPARSE_BLOCK) * kv_page_stride + (sl % ref.SPARSE_BLOCK) // ref.PAGE16
    tt = sl % ref.PAGE16
    d = torch.arange(HEAD_DIM, device=dev)
    base = (page * ref.PAGE_BYTES)[:, None]
    k_idx = base + (d // 16) * 256 + tt[:, None] * 16 + d % 16
    v_idx = base + d * ref.PAGE16 + tt[:, None]
    i_idx = sl[:, None] * HEAD_DIM + d
    sc_idx = (page * ref.PAGE16 + tt)[:, None]
    first = torch.argmax(live.to(torch.int32)).reshape(1)  # the first live row (0 if none)
    src = torch.where(live, torch.arange(s, device=dev), first)
    any_live = live.any()
    if v_cache is None:  # packed: K and V bytes in one write (one index_put_ of the storage)
        _put_rows(k_cache, torch.cat([k_idx, v_idx + v_offset], dim=1), kvb.reshape(s, 2 * HEAD_DIM), src, any_live)
    else:
        _put_rows(k_cache, k_idx, kvb[:, 0], src, any_live)
        _put_rows(v_cache, v_idx, kvb[:, 1], src, any_live)
    _put_rows(k_scale, sc_idx, sc[:, :1], src, any_live)
    _put_rows(v_scale, sc_idx, sc[:, 1:], src, any_live)
    _put_rows(index_cache, i_idx, ib, src, any_live)
    return q_out, iq_out


def index_scores_unfused(
    iq: torch.Tensor, index_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
    iscore: torch.Tensor, tag: torch.Tensor, fp8_dtype: torch.dtype, *, q_len: int = 1, init_blocks: int = 0,
    local_blocks: int = 1, topk_blocks: int = ref.TOPK_BLOCKS, sm_scale: float = ref.SM_SCALE,
) -> torch.Tensor:
    """Contract C.1 step 4 (A.9, one index head): block scores of the rows
    ``iq [S, 128]`` (or [S, 1, 128], bf16) written IN PLACE into ``iscore``
    (``torch.int64 [rows >= S, 8192]``: the kernel's iscore buffer viewed as
    pairs, value word low, tag word high) as ``(f32 bits, tag)`` at pair
    ``k * 8192 + b``, for the blocks the kernel scores: request r (rows r *
    q_len ..) scores blocks ``[init_blocks, n_blk - local_blocks)`` of its
    last row when ``n_blk = ceil(max(seq, 1) / 128) > topk_blocks``; other
    pairs keep their bytes. ``index_cache``: the uint8 byte view ``[blocks,
    128, 128]``; ``tag``: an int tensor of one element. Every column of the
    block table is gathered and scored (fixed shapes; unscored columns read
    block 0 and are discarded). Returns the scores ``[S, cols]`` f32 (unscored
    columns included)."""
    s = iq.shape[0]
    dev = iq.device
    cols = block_table.shape[1]
    reqs = s // q_len
    last_bt = block_table[q_len - 1::q_len]  # [R, cols] each request's last row
    seq = seq_lens.clamp_min(1)
    n_blk = (seq[q_len - 1::q_len] + ref.SPARSE_BLOCK - 1) // ref.SPARSE_BLOCK
    b = torch.arange(cols, device=dev)
    scored = (n_blk[:, None] > topk_blocks) & (b >= init_blocks) & (b < n_blk[:, None] - local_blocks)  # [R, cols]
    pages = torch.where(scored, last_bt.to(torch.int64), 0)
    keys = index_cache[pages].view(fp8_dtype).float()  # [R, cols, 128 keys, 128 dims], exact
    q = _bf16_values(iq).reshape(reqs, q_len, 1, 1, HEAD_DIM)
    dots = (keys[:, None] * q).sum(-1)  # [R, q_len, cols, 128] f32 (products exact)
    pos = b[:, None] * ref.SPARSE_BLOCK + torch.arange(ref.SPARSE_BLOCK, device=dev)  # [cols, 128]
    best = torch.where(pos < seq.reshape(reqs, q_len, 1, 1), dots, float("-inf")).amax(-1)  # [R, q_len, cols]
    scale = _SCORE_SCALES[sm_scale] if sm_scale in _SCORE_SCALES else ref.score_scale(sm_scale)
    val = (best * scale).reshape(s, cols)
    pair = (val.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) | (tag.reshape(1, 1).to(torch.int64) << 32)
    write = scored[:, None].expand(reqs, q_len, cols).reshape(s, cols)
    region = iscore[:s, :cols]
    region.copy_(torch.where(write, pair, region))
    return val


def k1_unfused(
    ar: torch.Tensor, res: torch.Tensor, g_in: torch.Tensor, w_qkv_t: torch.Tensor, s_qkv: torch.Tensor,
    g_q: torch.Tensor, g_k: torch.Tensor, g_iq: torch.Tensor, g_ik: torch.Tensor, cos_sin: torch.Tensor,
    positions: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
    k_scale: torch.Tensor, v_scale: torch.Tensor, index_cache: torch.Tensor, block_table: torch.Tensor,
    seq_lens: torch.Tensor, iscore: torch.Tensor, tag: torch.Tensor, *, eps: float, fp8_dtype: torch.dtype,
    fp8_max: float, gemm: str | None = None, pad_m: int = 1, q_len: int = 1, static_kv_scale: bool = False,
    kv_page_stride: int = 16, v_offset: int = 0, init_blocks: int = 0, local_blocks: int = 1,
    sm_scale: float = ref.SM_SCALE,
) -> dict[str, torch.Tensor]:
    """The whole unfused K1 (contract C.1 steps 1-4, one index head):
    :func:`pre_attn_unfused`, :func:`heads_unfused` on its qkv (the caches
    written in place), :func:`index_scores_unfused` on its iq_out and the
    index cache as step 3 left it (this launch's keys included). Byte views
    of the caches (``v_cache=None`` + ``v_offset`` for packed K / V sides) and
    the iscore pairs as in those functions. Returns a dict:
    h_out, q_out, iq_out (bf16) and the intermediates the guard checks
    (materialized anyway): qkv (bf16), x8, x_scale [S, 1]."""
    h_out, qkv, x8, x_scale = pre_attn_unfused(ar, res, g_in, w_qkv_t, s_qkv, eps, fp8_dtype, fp8_max, gemm=gemm,
                                               pad_m=pad_m, return_quant=True)
    q_out, iq_out = heads_unfused(qkv, g_q, g_k, g_iq, g_ik, cos_sin, positions, slot_mapping, k_cache, v_cache,
                                  k_scale, v_scale, index_cache, eps, fp8_dtype, fp8_max,
                                  static_kv_scale=static_kv_scale, kv_page_stride=kv_page_stride, v_offset=v_offset)
    index_scores_unfused(iq_out, index_cache, block_table, seq_lens, iscore, tag, fp8_dtype, q_len=q_len,
                         init_blocks=init_blocks, local_blocks=local_blocks, sm_scale=sm_scale)
    return {"h_out": h_out, "q_out": q_out, "iq_out": iq_out, "qkv": qkv, "x8": x8, "x_scale": x_scale}


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


# ----------------------------------------------------------------- comparing the head tasks and the scores
#
# Given its own qkv, each implementation's head outputs and cache bytes are the
# contract's exactly (compare_heads against codegen.reference.minimax_m3.heads
# on that qkv). Two implementations whose qkv differ (within compare_qkv's
# bound) produce q_out / iq_out that differ by the propagated qkv difference
# (compare_head_outputs) and scores that differ by the propagated iq
# difference (score_delta_bound); their cache bytes are not compared with each
# other (each is exact given its own qkv).

HEAD_OUTPUTS = ("q_out", "iq_out", "k_cache", "v_cache", "k_scale", "v_scale", "index_cache")


def packed_kv(want: dict, v_before: torch.Tensor, v_offset: int | None) -> dict:
    """``codegen.reference.minimax_m3.heads`` writes K and V into separate
    copies of the two views; where the V view lies ``v_offset`` bytes into the
    K view's storage (K and V sides packed in one block), the device's K view
    also shows the V bytes. Returns ``want`` with both caches as that storage
    holds them (the V bytes the reference changed, ``v_before`` = the V view
    before, laid into the K view). ``v_offset`` None: ``want`` unchanged."""
    if v_offset is None:
        return want
    k = want["k_cache"].contiguous().view(torch.uint8).reshape(-1).clone()
    v = want["v_cache"].contiguous().view(torch.uint8).reshape(-1)
    v0 = v_before.contiguous().view(torch.uint8).reshape(-1)
    seg = k[v_offset:v_offset + v.numel()]
    seg.copy_(torch.where(v != v0, v, seg))
    kd, vd = want["k_cache"], want["v_cache"]
    return dict(want, k_cache=k.view(kd.dtype).view(kd.shape),
                v_cache=k[v_offset:v_offset + v.numel()].clone().view(vd.dtype).view(vd.shape))


def compare_heads(got: dict, want: dict, exact: bool = True) -> dict:
    """The head outputs ``got`` (CPU tensors named as :data:`HEAD_OUTPUTS`:
    q_out, iq_out, the K / V cache views, their scales, the index cache, all
    as they are after the run) against the reference ``want`` (``heads`` of the
    same qkv from the same starting caches; :func:`packed_kv` for packed
    views). Returns ``ok`` and per output the number of differing elements and
    the largest distance (bf16 ulps for q_out / iq_out, FP8 codes for cache
    bytes, relative for scales). ``exact``: every byte equal; otherwise (a
    stated allowance, e.g. for a compiler's different rounding) q / iq within
    1 bf16 ulp, cache bytes within 1 FP8 code, scales within 2^-21 relative."""
    out: dict = {}
    ok = True
    for name in HEAD_OUTPUTS:
        a, b = got[name].cpu(), want[name].cpu()
        if a.shape != b.shape:
            out[name] = f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
            ok = False
            continue
        if name in ("q_out", "iq_out"):
            diff = (a.view(torch.int16) != b.view(torch.int16)) if a.dtype == torch.bfloat16 else a != b
            dist = int(bf16_ulp_diff(a.float(), b.float()).max().item()) if diff.any() else 0
            limit = 1
        elif name in ("k_scale", "v_scale"):
            diff = a.view(torch.int32) != b.view(torch.int32)
            dist = float(((a - b).abs() / b.abs().clamp_min(1e-30)).max().item()) if diff.any() else 0.0
            limit = 2.0**-21
        else:
            ab, bb = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
            diff = ab != bb
            dist = int(_fp8_code_distance(ab, bb).max().item()) if diff.any() else 0
            limit = 1
        n = int(diff.sum().item())
        good = n == 0 if exact else dist <= limit
        ok &= good
        out[name] = {"differ": n, "max_dist": dist}
    return {"ok": ok, "exact": all(isinstance(v, dict) and v["differ"] == 0 for v in out.values()), **out}


def _normed_heads(qkv: torch.Tensor, index_heads: int, index_own: int) -> torch.Tensor:
    """The 16 q heads and the own index-q head of ``qkv [S, rows]`` as f32 ``[S, 17, 128]``."""
    s = qkv.shape[0]
    e = qkv.float().reshape(s, -1, HEAD_DIM)
    return torch.cat([e[:, :Q_HEADS], e[:, Q_HEADS + 2 + index_own:Q_HEADS + 3 + index_own]], dim=1)


def compare_head_outputs(q_a, iq_a, qkv_a, q_b, iq_b, qkv_b, g_q, g_iq, eps: float, index_heads: int = 1,
                         index_own: int = 0) -> dict:
    """q_out / iq_out of two implementations (``[S, 2048]``, ``[S, 1, 128]``)
    computed exactly (contract A.5.4) from two different qkv (``[S, rows]``,
    bf16 values). Per head, the normed values of the two qkv in exact (f64)
    arithmetic differ by ``dn = |e_a r_a - e_b r_b| |1 + g|`` (r = 1 / sqrt(sum
    e^2 / 128 + eps) of each), a rotated value by at most ``dn + dn_partner``
    (|cos|, |sin| <= 1). Allowed: 2 bf16 ulps (both final roundings) + 1.01 x
    that + 2^-20 of the magnitude ``max(r) |1 + g| max|e|`` of the value and
    its partner (the implementations' f32 roundings). A
    value whose qkv moved by an FP8 flip or a cancelling dot product can be
    thousands of ulps off and still inside this bound. Returns ``ok``, ``n_over``, ``worst`` (largest
    |a - b| / allowed), ``max_ulp``, ``frac_le1`` / ``frac_le2`` (fractions of
    values within 1 / 2 bf16 ulps)."""
    s = qkv_a.shape[0]
    ea, eb = _normed_heads(qkv_a, index_heads, index_own).double(), _normed_heads(qkv_b, index_heads, index_own).double()
    em = torch.maximum(ea.abs(), eb.abs())
    ra = 1.0 / torch.sqrt((ea * ea).sum(-1, keepdim=True) / HEAD_DIM + eps)
    rb = 1.0 / torch.sqrt((eb * eb).sum(-1, keepdim=True) / HEAD_DIM + eps)
    g1 = torch.cat([g_q.float().reshape(1, HEAD_DIM).expand(Q_HEADS, HEAD_DIM), g_iq.float().reshape(1, HEAD_DIM)])
    g1 = (g1 + 1.0).double()
    # the normed values of each qkv in exact (f64) arithmetic: their difference is what the
    # qkv difference makes of them, with no linearization
    dn = (ea * ra - eb * rb).abs() * g1.abs()
    mag = torch.maximum(ra, rb) * g1.abs() * em
    partner = torch.arange(HEAD_DIM) ^ HALF
    rope = torch.arange(HEAD_DIM) < ROT
    dout = torch.where(rope, dn + dn[..., partner], dn)
    mags = torch.where(rope, mag + mag[..., partner], mag)
    a = torch.cat([q_a.float().cpu().reshape(s, Q_HEADS, HEAD_DIM), iq_a.float().cpu().reshape(s, 1, HEAD_DIM)], 1)
    b = torch.cat([q_b.float().cpu().reshape(s, Q_HEADS, HEAD_DIM), iq_b.float().cpu().reshape(s, 1, HEAD_DIM)], 1)
    allowed = 2 * bf16_ulp(torch.maximum(a.abs(), b.abs())) + (1.01 * dout + 2.0**-20 * mags).float()  # 1 %: f32 math
    d = (a - b).abs()
    over = ~(d <= allowed)
    u = bf16_ulp_diff(a, b)
    return {
        "ok": not bool(over.any()),
        "n_over": int(over.sum().item()),
        "worst": float((d / allowed).max().item()),
        "max_ulp": int(u.max().item()),
        "frac_le1": float((u <= 1).float().mean().item()),
        "frac_le2": float((u <= 2).float().mean().item()),
    }


def iscore_pairs(iscore: torch.Tensor) -> torch.Tensor:
    """The kernel's iscore bytes (or the int64 pair view) as CPU int32 ``[rows, 8192, 2]``
    (value word, tag word)."""
    return iscore.cpu().contiguous().view(torch.int32).reshape(-1, ref.ISCORE_STRIDE, 2)


def compare_iscore(after: torch.Tensor, before: torch.Tensor, tag: int, scores: torch.Tensor, want: torch.Tensor,
                   bound: torch.Tensor) -> dict:
    """iscore after a run (``after``, ``before``: the buffer's bytes or pair
    views) against ``codegen.reference.minimax_m3.index_scores`` (``scores``,
    ``want``, ``bound`` [S, 8192]): the pairs tagged ``tag`` are exactly the
    ones the reference scores, every other pair keeps its bytes, -inf where
    the reference says -inf, every other value within ``bound``. Returns
    ``ok``, ``written``, ``mask_differs``, ``untouched_changed``, ``worst``
    (largest |error| / bound)."""
    pa, pb = iscore_pairs(after), iscore_pairs(before)
    s = scores.shape[0]
    written = pa[..., 1] == tag
    mask_differs = int((written[:s] != want).sum().item()) + int(written[s:].sum().item())
    keep = torch.ones_like(written)
    keep[:s] = ~want
    untouched_changed = int((pa[keep] != pb[keep]).any(-1).sum().item())
    got = pa[:s, :, 0].view(torch.float32)[want]
    ref_v = scores[want]
    fin = torch.isfinite(ref_v)
    inf_ok = torch.equal(torch.isfinite(got), fin) and bool((got[~fin] == ref_v[~fin]).all())
    err = (got[fin] - ref_v[fin]).abs()
    lim = bound[want][fin]
    over = int((~(err <= lim)).sum().item())
    worst = float((err / lim.clamp_min(1e-30)).max().item()) if err.numel() else 0.0
    return {"ok": mask_differs == 0 and untouched_changed == 0 and inf_ok and over == 0,
            "written": int(want.sum().item()), "mask_differs": mask_differs, "untouched_changed": untouched_changed,
            "inf_ok": inf_ok, "n_over": over, "worst": worst}


def score_delta_bound(iq_a: torch.Tensor, iq_b: torch.Tensor, index_cache: torch.Tensor, block_table: torch.Tensor,
                      seq_lens: torch.Tensor, q_len: int, init_blocks: int = 0, local_blocks: int = 1,
                      sm_scale: float = ref.SM_SCALE) -> torch.Tensor:
    """``[S, 8192]``: how far the exact scores of two index q's may lie apart
    (the max over keys is 1-Lipschitz): ``|scale| max_j sum_d |K_jd| |iq_a -
    iq_b|_d`` over each scored block's keys (``index_cache`` fp8; the bound
    column of :func:`codegen.reference.minimax_m3.index_scores` of |iq_a -
    iq_b|, scaled back from its 2^-16)."""
    dq = (iq_a.float().cpu() - iq_b.float().cpu()).abs().reshape(iq_a.shape[0], HEAD_DIM)
    _, _, b = ref.index_scores(dq, index_cache, block_table, seq_lens, q_len, init_blocks, local_blocks, sm_scale)
    return b * 2.0**16
