"""Stage kind ``key_table``: each token's attention keys for the attention
kernel (contract B.5.6), one task per token, integer-exact.

    live   = slot[t] >= 0
    ntopk  = live and ratio > 0 ? min((pos[t] + 1) / ratio, TOPK) : 0
    kv_len = ntopk + (live ? swa_lens[t] : 0)
    KT[t][k] = (comp_bt[t2r[t] * bt_stride + local / comp_block] * comp_block
                + local % comp_block) | 1 << 31     k < ntopk, local = topk[t][k] >= 0
             = -1                                   k < ntopk, local < 0
             = swa_idx[t][min(k - ntopk, WINDOW - 1)]   k < kv_len
             = -1                                   otherwise
    KLEN[t] = kv_len;  KLEN[S + t] = ntopk

Bit 31 marks a compressed-cache slot. comp_bt is read only where an entry
needs it (a pad row's request index is never used to index it); the token's own
rows of topk and swa_idx and its t2r entry are read whole and at once, so a
task costs two dependent round trips (one before comp_bt), not four."""

from __future__ import annotations

from typing import Literal

from ..spec.models import Expr, Name, StageBase

KIND = "key_table"
STAMPED_POINTS = ("done_point",)


class Model(StageBase):
    kind: Literal["key_table"]
    keys: Expr = "KEYS"  # entries of a token's row (TOPK + WINDOW)
    topk_keys: Expr = "TOPK"  # top-k entries of a token (the topk row's width)
    window: Expr = "WINDOW"  # window entries of a token (swa_idx's row width)
    ratio: Expr = "ratio"  # compress ratio (0: no top-k keys)
    # ABI arguments (the seed's names)
    pos: Name = "pos"
    slot: Name = "slot"
    swa_idx: Name = "swa_idx"
    swa_lens: Name = "swa_lens"
    topk: Name = "topk"
    t2r: Name = "t2r"
    comp_bt: Name = "comp_bt"
    comp_block: Name = "comp_block"
    bt_stride: Name = "bt_stride"
    kt: Name = "kt"
    klen: Name = "klen"


def lower(stage: Model, ctx) -> dict:
    """Template values: row widths and the ratio."""
    keys = ctx.integer(stage.keys, ("keys",))
    topk = ctx.integer(stage.topk_keys, ("topk_keys",))
    window = ctx.integer(stage.window, ("window",))
    ratio = ctx.integer(stage.ratio, ("ratio",), minimum=0)
    if keys != topk + window:
        ctx.fail(("keys",), f"keys {keys} != topk_keys + window = {topk + window}")
    if ctx.task_count != ctx.tokens:
        ctx.fail(("tasks",), f"{ctx.task_count} tasks: one per token ({ctx.tokens}) expected", "set tasks to tokens")
    s = ctx.tokens
    for f, dtype, shape in (("pos", "i64", (s,)), ("slot", "i64", (s,)), ("swa_idx", "i32", (s, 1, window)),
                            ("swa_lens", "i32", (s,)), ("topk", "i32", (s, topk)), ("t2r", "i32", (s,)),
                            ("comp_bt", "i32", (None, None))):
        ctx.abi_arg(getattr(stage, f), (f,), dtype=dtype, shape=shape)
    ctx.abi_arg(stage.comp_block, ("comp_block",), dtype="i32", scalar=True, within=(1, None))  # a divisor
    ctx.abi_arg(stage.bt_stride, ("bt_stride",), dtype="i32", scalar=True)
    ctx.abi_arg(stage.kt, ("kt",), dtype="i32", shape=(s, keys), written=True)
    ctx.abi_arg(stage.klen, ("klen",), dtype="i32", shape=(2 * s,), written=True)
    ctx.lds(stage.name, "window", "int", window)  # the token's swa_idx row
    return {"n_keys": keys, "topk": topk, "window": window, "ratio": ratio, "fields": stage}
