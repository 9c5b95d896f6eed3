"""Stage kind ``index_scores``: MiniMax-M3's indexer block scores (contract A.9).

For each request (``q_len`` consecutive rows) whose last row's context spans
more than ``topk_blocks`` blocks, every block b in ``[init, n_blk - local)``
is scored for every row k of the request:
``score = max_{j in b, j < seq_k} dot(bf16(K_j), iq_k) * f32(sm_scale * log2 e)``
(``-inf`` where no key of the block is in the row's context), written to the
``iscore`` pair ``k * stride + b`` with the launch's tag. Shorter contexts keep
all their blocks (unscored); the pinned first / last blocks are never written.

The work list (request, block) is known only at run time (``seq_lens``): every
CTA of the stage computes it and takes items ``u`` with ``u % CTAS`` equal to
its rank, counted from ``lead_cta`` (the CTAs that finish earlier work first).
A row's index q is made by the scorers themselves from the qkv mailbox with
the head stage's (``iq_from``) math, so they never wait for its head task; a
block that may hold a key inserted by this launch is read only after every
token's index-K head task is done (its flag).

Index-head context parallelism (``index_heads`` 4, rank ``index_own``): a
request whose last row sees more than ``cp_from_blocks`` blocks is long: it
scores only this rank's blocks ``b = first_own + 4 i`` for all four index
heads, into pair ``k * stride + h * stride / 4 + b / 4``.

Batches (``batch_items``): a CTA scores its items ``batch_items`` at a time, with one
CTA barrier a batch, while the keys of the next ``batches_ahead`` batches load.
The dots (``mma_dots``):

- on the CUDA cores: each thread a quarter of a key, 32 FMAs a row; the next batch's
  keys in registers (``batches_ahead`` 1);
- on sm90's tensor cores: each half of the CTA's warps takes an item of a batch of two,
  each warp a tile of 16 keys as the rows of bf16 m16n8k16 MMAs against 8 index-q rows
  at a time. The keys enter exactly (their fp8 bits placed as bf16 times 2^-120), the
  index q times 2^64, and the maxima are scaled back by 2^56, exactly. Each thread
  copies its own 64 bytes of a batch's keys into LDS (cp.async, counted waits): keys
  loaded into registers were waited for together with the next batch's, which ptxas
  counts on the same scoreboard.

The stage's start puts the requests, the rows' context lengths, the block-table
entries of the CTA's first items and every index q into LDS, so that no key load
waits for a block-table read and no item for its index q (made once per stage, not
once per request a CTA meets). On the H200 the tensor-core scorer is bound by its
instructions and their latency, not by the keys (bench/NOTES.md, session 5)"""

from __future__ import annotations

from typing import Literal

import numpy as np

from pydantic import field_validator

from ..spec.models import Expr, Name, PerTarget, StageBase, per_target

KIND = "index_scores"
LOG2E = 1.4426950408889634
REQUEST_WORDS = 5  # the template's struct Request: count, first, step, heads, new_from
MAX_BATCH = 4  # batch_items: two batches' keys in registers, 8 a thread an item
IQ_PAD = 4  # index-q quarters 36 floats apart: 16-byte LDS reads, the four quarters on distinct banks
MAX_AHEAD = 4  # batches_ahead with mma_dots: 5 slots of 32 KB
MAX_WARP_AHEAD = 7  # warp_items: a warp's ring of at most 8 tiles (16 KB)
MMA_KEY_DOWN_LOG2 = 120  # mma_dots (bf16): an fp8 key's bits placed as bf16 are its value times 2^-120
MMA_IQ_UP_LOG2 = 64  # mma_dots (bf16): index q goes in times 2^64 (exact while |iq| < 2^64)
MMA_TILE_KEYS = 16  # mma_dots: keys of a warp's tile (the m16n8k16 rows)
MMA_IQ_PAD = 2  # mma_dots: index-q rows 66 words apart: a warp's 8-byte B-fragment reads on distinct banks


class Model(StageBase):
    kind: Literal["index_scores"]
    iq_from: Name  # the head_norm_rope stage whose qkv rows, index-q math and index-K flags this uses
    topk_blocks: Expr = "TOPK_BLOCKS"  # contexts of at most this many blocks are not scored
    init_blocks: Expr = "init_blocks"  # pinned leading blocks (never scored)
    local_blocks: Expr = "local_blocks"  # pinned trailing blocks (never scored)
    sm_scale: Expr = "SM_SCALE"
    block: Expr = "SPARSE_BLOCK"  # keys per block
    stride: Expr = "MAX_INDEX_BLOCKS"  # iscore pairs per row
    max_tokens: Expr = "MAX_TOKENS"  # new keys lie in a row's last max_tokens positions
    lead_cta: PerTarget = PerTarget(default=0)  # the stage CTA that takes work item 0
    index_heads: Expr = "index_heads"  # index-q heads in the projection (1, or 4 with context parallelism)
    index_own: Expr = "index_own"  # this rank's index-q head
    cp_from_blocks: Expr = "INDEX_CP_FROM_BLOCKS"  # longer requests are scored head-parallel

    # items scored between two CTA barriers; the next batch's keys load meanwhile (registers)
    batch_items: PerTarget = PerTarget(default=1)
    # the dots on the tensor cores (sm90, 1) or the CUDA cores (0)
    mma_dots: PerTarget = PerTarget(default=0)
    # batches whose keys are in flight while one is scored: 1 on the CUDA cores (registers);
    # with mma_dots up to MAX_AHEAD (cp.async into LDS slots, 32 KB a batch)
    batches_ahead: PerTarget = PerTarget(default=1)
    # with mma_dots: f16 MMAs (1) instead of bf16 (0): a key pair converts in one instruction, not
    # three; each index-q row is scaled by a power of two into f16's range
    mma_f16: PerTarget = PerTarget(default=0)
    # warp-owned items (with mma_dots; 0: off): each warp scores whole items alone, no CTA
    # barrier, with this many tiles of keys in flight (cp.async into its own ring)
    warp_items: PerTarget = PerTarget(default=0)
    # with warp_items: a CTA with at least this many items takes them by warps, one with fewer
    # in batches (both paths built; 0: always by warps)
    warp_items_from: PerTarget = PerTarget(default=0)

    _per_target = field_validator("lead_cta", "batch_items", "mma_dots", "batches_ahead", "warp_items", "mma_f16",
                                  "warp_items_from", mode="before")(
        classmethod(lambda cls, v: per_target(v)))
    # analysis stamps (timeline builds; off in the spec): the phases of the batch holding each
    # CTA's item `stamped_item` (its j-th; a CTA with fewer items stamps none)
    stamped_item: Expr = 0
    item_point: Name | None = None  # timeline point: its scoring starts (its keys are asked for)
    dots_point: Name | None = None  # timeline point: warp 0's dots and maxima of it are in (its keys had landed)
    put_point: Name | None = None  # timeline point: its scores are put (after the item's barrier)
    index_cache: Name = "index_cache"
    block_table: Name = "block_table"
    seq_lens: Name = "seq_lens"
    bt_width: Name = "bt_width"
    q_len: Name = "q_len"
    iscore: Name = "iscore"


def score_scale(sm_scale: float) -> float:
    """``f32(f32(sm_scale) * f32(log2 e))``: the factor applied after the max."""
    return float(np.float32(np.float32(sm_scale) * np.float32(LOG2E)))


def lower(stage: Model, ctx) -> dict:
    ev = ctx.evaluate
    src = ctx.stage_model(stage.iq_from, ("iq_from",), kind="head_norm_rope")
    if src.done is None:
        ctx.fail(("iq_from",), f"stage {stage.iq_from!r} publishes no done flags", "give it 'done: <pairs region>'")
    if stage.iq_from not in stage.waits_on:
        ctx.fail(("waits_on",), f"the scores read {stage.iq_from!r}'s outputs", f"list {stage.iq_from!r} in waits_on")
    for f in ("index_cache", "block_table", "seq_lens", "bt_width", "q_len", "iscore"):
        ctx.abi_arg(getattr(stage, f), (f,))
    block = ev(stage.block, ("block",))
    if ctx.threads % block:
        ctx.fail(("block",), f"{ctx.threads} threads do not split into key columns of {block}")
    head_dim = ev(src.head_dim, ("iq_from",))
    heads, own = ev(stage.index_heads, ("index_heads",)), ev(stage.index_own, ("index_own",))
    if heads not in (1, 4) or not 0 <= own < heads:
        ctx.fail(("index_own",), f"index heads {heads} with own head {own}: need 1 head, or 4 with own in 0..3")
    iq_base = ev(src.iq_off, ("iq_from",)) - own * head_dim
    rows = ctx.tokens * heads  # (token, head) rows of index q
    quarters = ctx.threads // block  # threads per key
    batch = ctx.integer(stage.batch_items.for_target(ctx.target.name), ("batch_items",), minimum=1)
    if batch > MAX_BATCH:
        ctx.fail(("batch_items",), f"batches of {batch} keep {16 * batch} key registers a thread, "
                 f"more than the {16 * MAX_BATCH} allowed", f"give batch_items at most {MAX_BATCH}")
    mma = ctx.switch(stage.mma_dots.for_target(ctx.target.name), ("mma_dots",))
    waves = ctx.threads // ctx.target.wave_size
    item_waves = block // MMA_TILE_KEYS if mma else waves  # waves whose maxima make an item's
    f16 = ctx.switch(stage.mma_f16.for_target(ctx.target.name), ("mma_f16",))
    if f16 and not mma:
        ctx.fail(("mma_f16",), "mma_f16 picks the tensor-core dots' input type", "turn mma_dots on, or mma_f16 off")
    warp = ctx.integer(stage.warp_items.for_target(ctx.target.name), ("warp_items",), minimum=0)
    warp_from = ctx.integer(stage.warp_items_from.for_target(ctx.target.name), ("warp_items_from",), minimum=0)
    batched = not warp or warp_from > 0  # the batched path is built (alone, or beside the warps' for few items)
    if warp_from and not warp:
        ctx.fail(("warp_items_from",), "warp_items_from picks between warp-owned items and batches",
                 "turn warp_items on, or give warp_items_from 0")
    if warp:
        if not mma:
            ctx.fail(("warp_items",), "warp-owned items score on the tensor cores", "turn mma_dots on, or warp_items off")
        if not batched and batch != 1:
            ctx.fail(("warp_items",), f"warp-owned items take no batches (batch_items {batch})",
                     "give batch_items 1 where warp_items is on alone (or warp_items_from > 0)")
        if warp > MAX_WARP_AHEAD:
            ctx.fail(("warp_items",), f"{warp} tiles ahead: at most {MAX_WARP_AHEAD}",
                     f"give warp_items 1 .. {MAX_WARP_AHEAD}")
    if mma:
        if ctx.target.vendor != "nvidia":
            ctx.fail(("mma_dots",), f"{ctx.target.name}'s device library has no bf16 m16n8k16 MMA",
                     "give mma_dots 0 for this target (it is an sm90 knob)")
        if batched and batch * item_waves != waves:
            ctx.fail(("mma_dots",), f"the tensor-core dots take {item_waves} waves an item: {waves} waves score "
                     f"{waves // item_waves} items a batch, not {batch}",
                     f"give batch_items {waves // item_waves} where mma_dots is on")
    ahead = ctx.integer(stage.batches_ahead.for_target(ctx.target.name), ("batches_ahead",), minimum=1)
    if not mma and ahead != 1:
        ctx.fail(("batches_ahead",), f"the CUDA-core dots keep one batch ahead (registers), not {ahead}",
                 "give batches_ahead 1 where mma_dots is off")
    if ahead > MAX_AHEAD:
        ctx.fail(("batches_ahead",), f"{ahead} batches ahead: at most {MAX_AHEAD}", f"give batches_ahead 1 .. {MAX_AHEAD}")
    if mma:  # index q as bf16 pairs, rows padded, 8 rows more: a B fragment may read past the last request's
        ctx.lds(stage.name, "iq", "u32", (rows + 8) * (head_dim // 2 + MMA_IQ_PAD))
    else:
        ctx.lds(stage.name, "iq", "float", rows * quarters * (head_dim // quarters + IQ_PAD))  # index q, quarters padded
    if batched:
        ctx.lds(stage.name, "best", "float", 2 * batch * rows * item_waves)  # per-wave maxima, two batches
    if mma and batched:  # each thread's 64 bytes of a batch's keys, in AHEAD + 1 slots
        slot_bytes = 4 * ctx.threads * 16
        if (ahead + 1) * slot_bytes > ctx.lds_left(stage.name):
            ctx.fail(("batches_ahead",), f"{ahead + 1} key slots of {slot_bytes} bytes do not fit the "
                     f"{ctx.lds_left(stage.name)} bytes of LDS left", "give batches_ahead fewer")
        ctx.lds(stage.name, "keys", "u32", (ahead + 1) * slot_bytes // 4)
    ctx.lds(stage.name, "reqs", "u32", REQUEST_WORDS * ctx.tokens)  # each request's work (the template's Request)
    ctx.lds(stage.name, "seq", "u32", ctx.tokens)  # each row's context length
    ctx.lds(stage.name, "pages", "u32", ctx.threads)  # the block-table entries of a CTA's first items
    if warp:  # each warp's ring of warp + 1 tiles (2 KB each)
        ring_bytes = waves * (warp + 1) * MMA_TILE_KEYS * head_dim
        if ring_bytes > ctx.lds_left(stage.name):
            ctx.fail(("warp_items",), f"{waves} rings of {warp + 1} tiles ({ring_bytes} bytes) do not fit the "
                     f"{ctx.lds_left(stage.name)} bytes of LDS left", "give warp_items fewer tiles ahead")
        ctx.lds(stage.name, "ring", "u32", ring_bytes // 4)
    return {
        "topk_blocks": ev(stage.topk_blocks, ("topk_blocks",)),
        "init_blocks": ev(stage.init_blocks, ("init_blocks",)),
        "local_blocks": ev(stage.local_blocks, ("local_blocks",)),
        "scale": score_scale(ev(stage.sm_scale, ("sm_scale",))),
        "block": block,
        "stride": ev(stage.stride, ("stride",)),
        "max_tokens": ev(stage.max_tokens, ("max_tokens",)),
        "lead": ev(stage.lead_cta.for_target(ctx.target.name), ("lead_cta",)),
        "head_dim": head_dim,
        "rotary_dim": ev(src.rotary_dim, ("iq_from",)),
        "lanes": 32,
        "elems": head_dim // 32,
        # the head stage's tasks: q heads, k, v, index q, index k (its done flags)
        "head_tasks": ev(src.q_heads, ("iq_from",)) + 4,
        "task_ik": ev(src.q_heads, ("iq_from",)) + 3,
        "qkv_rows": ev(src.rows, ("iq_from",)),
        "iq_base": iq_base,
        "heads": heads,
        "own": own,
        "cp_from": ev(stage.cp_from_blocks, ("cp_from_blocks",)),
        "batch": batch,
        "mma": mma,
        "ahead": ahead,
        "warp": warp,
        "f16": f16,
        "warp_ring": warp + 1,
        "warp_from": warp_from,
        "batched": batched,
        "mma_iq_pad": MMA_IQ_PAD,
        "tile_keys": MMA_TILE_KEYS,
        "key_down_log2": MMA_KEY_DOWN_LOG2,
        "iq_up_log2": MMA_IQ_UP_LOG2,
        "iq_up": 2.0 ** MMA_IQ_UP_LOG2,
        "dot_unscale": 2.0 ** (MMA_KEY_DOWN_LOG2 - MMA_IQ_UP_LOG2),  # the maxima scaled back, exactly
        "iq_pad": IQ_PAD,
        "request_words": REQUEST_WORDS,
        "stamped_item": ctx.integer(stage.stamped_item, ("stamped_item",), minimum=0),
        "done": src.done,
        "src": src,
        "start_point": stage.start_point,  # checked by the lowering for every stage
        "done_point": stage.done_point,
        "fields": stage,
    }

