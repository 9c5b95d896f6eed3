"""Stage kind ``head_norm_rope``: MiniMax-M3's per-head tasks after the qkv GEMV.

One task per head of the fused projection, every token of the launch at once
(contract A.5.4 - A.6): q heads, k, v, the own index-q head, index k. A token
runs on 32 lanes, lane l holding dims 4l .. 4l + 3 (a warp on NVIDIA, a half
wave on AMD). Heads other than v: gemma RMSNorm (sum of squares as plain
multiply-adds, butterfly 16..1), then partial NeoX RoPE on dims < ROTARY_DIM
with ``fma(n, c, -/+(p * s))``. Outputs: q and index q in bf16; K into the
page-16 SHUFFLE cache with a per-token scale (amax / FP8_MAX of the f32 head,
or 1.0 in ``static_kv_scale`` builds); V raw into its page-16 cache likewise;
index K into the index cache (E4M3, unit scale). A negative slot skips every
cache write."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from ..spec.models import Expr, Name, PerTarget, StageBase, per_target

KIND = "head_norm_rope"
STAMPED_POINTS = ()
LANES = 32  # lanes per token
ELEMS = 4  # dims per lane
PAGE16 = 16  # tokens per page-16 page
PAGE_BYTES = 2048  # one page-16 page of one kv head: 16 tokens x 128 dims


class Model(StageBase):
    kind: Literal["head_norm_rope"]
    got_point: Name | None = "head_got_qkv"  # timeline point: the head's qkv values arrived (thread 0's: token 0's)
    last_got_point: Name | None = None  # timeline point: the last of the CTA's tokens (of all its tasks) got its qkv values
    stored_point: Name | None = None  # timeline point: the task's stores issued (index q: its pairs too)
    fenced_point: Name | None = None  # timeline point: the release fence after them passed (with done)
    qkv: Name  # pairs region: the GEMV's rows, token t at pair t * rows
    rows: Expr  # pair stride of a token in qkv
    q_heads: Expr  # local q heads: tasks 0 .. q_heads - 1
    k_off: Expr  # first row of k in a token's qkv row (v, index q, index k likewise)
    v_off: Expr
    iq_off: Expr
    ik_off: Expr
    head_dim: Expr = "HEAD_DIM"
    rotary_dim: Expr = "ROTARY_DIM"
    sparse_block: Expr = "SPARSE_BLOCK"  # logical KV block size (tokens)
    # ABI arguments (the seed's names by default)
    g_q: Name = "g_q"
    g_k: Name = "g_k"
    g_iq: Name = "g_iq"
    g_ik: Name = "g_ik"
    cos_sin: Name = "cos_sin"
    positions: Name = "positions"
    slot_mapping: Name = "slot_mapping"
    k_cache: Name = "k_cache"
    v_cache: Name = "v_cache"
    k_scale: Name = "k_scale"
    v_scale: Name = "v_scale"
    index_cache: Name = "index_cache"
    q_out: Name = "q_out"
    iq_out: Name = "iq_out"
    done: Name | None = None  # pairs region: flag token * TASKS + task once that head's stores are visible
    # the index-q task's bf16 values also put as tagged pairs into region iq_pairs (token t's dims
    # 2i, 2i + 1 at pair t * head_dim / 2 + i), each its own ready flag (1 = on, per target), for
    # the scorer that takes the index q from this stage (index_scores iq_from_out, which must
    # match): it polls them, with no release fence, done flag or second load on its way
    iq_tagged: PerTarget = PerTarget(default=0)
    iq_pairs: Name | None = None

    _iq_tagged = field_validator("iq_tagged", mode="before")(classmethod(lambda cls, v: per_target(v)))


def lower(stage: Model, ctx) -> dict:
    """Template values: the head roles by task, the page layout, the flags."""
    ev = ctx.evaluate
    head_dim, rotary = ev(stage.head_dim, ("head_dim",)), ev(stage.rotary_dim, ("rotary_dim",))
    if head_dim != LANES * ELEMS:
        ctx.fail(("head_dim",), f"head_dim {head_dim} != {LANES} lanes x {ELEMS} dims", "use 128")
    if rotary % (2 * ELEMS) or rotary > head_dim:
        ctx.fail(("rotary_dim",), f"rotary_dim {rotary} must be a multiple of {2 * ELEMS} and <= {head_dim}")
    q_heads = ev(stage.q_heads, ("q_heads",))
    if ctx.task_count != q_heads + 4:
        ctx.fail(("tasks",), f"{ctx.task_count} tasks != q_heads + 4 = {q_heads + 4} (q heads, k, v, index q, index k)",
                 "set tasks to q_heads + 4")
    if ctx.tokens * LANES > ctx.threads:
        ctx.fail(("tasks",), f"{ctx.tokens} tokens x {LANES} lanes exceed {ctx.threads} threads")
    ctx.region(stage.qkv, ("qkv",), kind="pairs")
    if stage.done is not None:
        ctx.region(stage.done, ("done",), kind="pairs")
    iq_tagged = ctx.switch(stage.iq_tagged.for_target(ctx.target.name), ("iq_tagged",))
    if iq_tagged:
        if stage.iq_pairs is None:
            ctx.fail(("iq_pairs",), "iq_tagged puts the index q into a pairs region, and none is named",
                     "name one (iq_pairs: a scratch region of kind pairs, MAX_TOKENS * HEAD_DIM / 2 of them)")
        ctx.region(stage.iq_pairs, ("iq_pairs",), kind="pairs", min_count=ctx.tokens * head_dim // 2)
    for f in ("g_q", "g_k", "g_iq", "g_ik", "cos_sin", "positions", "slot_mapping", "k_cache", "v_cache",
              "k_scale", "v_scale", "index_cache", "q_out", "iq_out"):
        ctx.abi_arg(getattr(stage, f), (f,))
    build = dict(ctx.build.params)
    stride = build.get("kv_page_stride", ev(stage.sparse_block, ("sparse_block",)) // PAGE16)
    return {
        "rows": ev(stage.rows, ("rows",)),
        "q_heads": q_heads,
        "offsets": {r: ev(getattr(stage, f"{r}_off"), (f"{r}_off",)) for r in ("k", "v", "iq", "ik")},
        "head_dim": head_dim,
        "rotary_dim": rotary,
        "sparse_block": ev(stage.sparse_block, ("sparse_block",)),
        "page_stride": stride,
        "static_kv_scale": bool(build.get("static_kv_scale", False)),
        "iq_tagged": iq_tagged,  # the index q into iq_pairs too
        "lanes": LANES,
        "elems": ELEMS,
        "page16": PAGE16,
        "page_bytes": PAGE_BYTES,
        "fields": stage,
    }
