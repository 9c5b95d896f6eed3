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

Key ring (``key_ring``, sm90): a block's keys travel as one TMA bulk copy into an
LDS ring of as many 16 KB slots as fit beside the other stages' LDS (kernel
lifetime: the kernel's start copies the CTA's first items while the earlier
stages run, except blocks that may hold a new key); the same arithmetic on the
same bytes, so the same scores."""

from __future__ import annotations

from typing import Literal

import numpy as np

from pydantic import field_validator

from ..spec.models import Expr, Name, PerTarget, StageBase, per_target

KIND = "index_scores"
LOG2E = 1.4426950408889634
RING_IQ_PAD = 4  # key ring: index-q quarters 36 floats apart, 16-byte LDS reads on distinct banks


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

    # keys per target through an LDS ring of TMA bulk copies (sm90), one block's keys a slot,
    # issued from the kernel's start; 0 = through registers, one item ahead
    key_ring: PerTarget = PerTarget(default=0)  # most ring slots (as many as fit beside the stages' LDS); 0: off

    _lead = field_validator("lead_cta", "key_ring", mode="before")(classmethod(lambda cls, v: per_target(v)))
    index_cache: Name = "index_cache"
    block_table: Name = "block_table"
    seq_lens: Name = "seq_lens"
    bt_width: Name = "bt_width"
    q_len: Name = "q_len"
    iscore: Name = "iscore"


def score_scale(sm_scale: float) -> float:
    """``f32(f32(sm_scale) * f32(log2 e))``: the factor applied after the max."""
    return float(np.float32(np.float32(sm_scale) * np.float32(LOG2E)))


def ring_slots(stage: Model, ctx, slot_bytes: int, own_words: list[int]) -> int:
    """The key ring's slots: at most ``key_ring``, as many as fit (with their mbarriers) beside
    the union of the stages lowered so far, this one's own buffers with a ring (``own_words``:
    4-byte elements each) and the timeline stamps; 0 where none fits."""
    want = ctx.integer(stage.key_ring.for_target(ctx.target.name), ("key_ring",), minimum=0)
    if want and ctx.target.vendor != "nvidia":
        ctx.fail(("key_ring",), f"{ctx.target.name}'s device library has no bulk copies",
                 "turn key_ring off for this target (it is an sm90 knob)")
    if slot_bytes % 16:
        ctx.fail(("key_ring",), f"a block's keys ({slot_bytes} B) are not whole 16-byte bulk-copy units",
                 "turn key_ring off for this build")
    own = sum(_aligned(4 * n) for n in own_words)
    room = min(ctx.lds_kernel_left(), ctx.lds_left(stage.name) - own)  # ctx.lds_left: nothing declared yet
    return max((n for n in range(want + 1) if n * slot_bytes + _aligned(8 * n) <= room), default=0)


def _aligned(nbytes: int) -> int:
    """Bytes of an LDS buffer as the layout packs it (16-byte aligned)."""
    return -(-nbytes // 16) * 16


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
    rows = ctx.tokens * heads  # (row, head) pairs of a request's index q
    quarters = ctx.threads // block  # threads per key
    best = rows * (ctx.threads // ctx.target.wave_size)
    slots = ring_slots(stage, ctx, block * head_dim,
                       [rows * quarters * (head_dim // quarters + RING_IQ_PAD), 2 * best, ctx.threads])
    pad = RING_IQ_PAD if slots else 1
    ctx.lds(stage.name, "iq", "float", rows * quarters * (head_dim // quarters + pad))  # index q, quarters padded
    ctx.lds(stage.name, "best", "float", best * (2 if slots else 1))  # per-wave maxima (ring: two items' halves)
    if slots:
        ctx.lds(stage.name, "pages", "u32", ctx.threads)  # the block-table entries of a CTA's first items
        # written from the kernel's start: LDS no stage reuses
        ctx.lds_kernel(stage.name, "ring", "u32", slots * block * head_dim // 4)  # slot s at s * SLOT_BYTES
        ctx.lds_kernel(stage.name, "ring_bar", "u64", slots)  # slot s's mbarrier
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
        "ring": slots,
        "iq_pad": pad,
        "prologue": slots > 0,  # the kernel's start issues the first copies (kernel.hip.j2)
        "done": src.done,
        "src": src,
        "start_point": stage.start_point,  # checked by the lowering for every stage
        "done_point": stage.done_point,
        "fields": stage,
    }

