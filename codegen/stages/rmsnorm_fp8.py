"""Stage kind ``rmsnorm_fp8``: residual add, gemma RMSNorm, per-token FP8.

One task per token row (contract A.5.1, A.5.2): ``acc = f32(ar) + f32(res)``,
``h_out = bf16(acc)``, the sum of squares in the fused all-reduce's order,
``n = (acc * rsq(tot / HIDDEN + eps)) * (g + 1)``, then ``x8 = fp8(n / s)``
with ``s = amax / FP8_MAX``. The row goes to a ``words`` mailbox region and
its scale, the row's ready flag, to a ``pairs`` region. A GEMV stage can run
the same math inline instead, in builds that leave this stage out
(``gemv_fp8`` with ``norm_inline``)."""

from __future__ import annotations

from typing import Literal

from ..spec.models import Name, StageBase

KIND = "rmsnorm_fp8"
STAMPED_POINTS = ("done_point",)
LTS_WIDTH = 8  # elements per logical thread: one 16-byte bf16 load
LOGICAL_WARP = 32  # logical threads per butterfly group of the original all-reduce


class Model(StageBase):
    kind: Literal["rmsnorm_fp8"]
    sums_point: Name | None = "sums_reduced"  # timeline point: the row's sum of squares reduced
    hidden: Name = "HIDDEN"
    ar: Name  # ABI tensor [tokens, HIDDEN] bf16: the all-reduced partials
    res: Name  # ABI tensor [tokens, HIDDEN] bf16: residual in
    residual_out: Name  # ABI tensor [tokens, HIDDEN] bf16: bf16(ar + res)
    gamma: Name  # ABI tensor [HIDDEN] bf16: gemma weight (used as 1 + g)
    x8: Name  # scratch words region: the token's FP8 row
    x8_scale: Name  # scratch pairs region: the token's scale (its ready flag)
    residual_done: Name | None = None  # pairs region: token t's residual written (builds with signal=true)


def norm_constants(hidden: int, threads: int) -> dict:
    """The layout of one row over a CTA: logical thread lt = i * THREADS + tid
    holds elements 8lt .. 8lt + 7. Every aligned 32-lane group then holds 32
    consecutive lts, so an xor butterfly over 16..1 is the original's logical
    warp on a wave of 32 or 64 lanes alike."""
    if hidden % (LTS_WIDTH * LOGICAL_WARP):
        raise ValueError(f"HIDDEN = {hidden} is not a multiple of {LTS_WIDTH * LOGICAL_WARP}")
    lts = hidden // LTS_WIDTH
    warps = lts // LOGICAL_WARP
    if warps > 32:
        raise ValueError(f"HIDDEN = {hidden} needs {warps} > 32 logical warps")
    return {
        "NORM_LTS": lts,
        "NORM_SLOTS": -(-lts // threads),
        "NORM_WARPS": warps,
        "ROW_WORDS": hidden // 4,
    }


def lower(stage: Model, ctx) -> dict:
    """Template values of the stage: the norm layout and the bound names."""
    hidden = ctx.symbol(stage.hidden, ("hidden",))
    if ctx.task_count != ctx.tokens:  # fewer: a reader waits for a row no task writes; more: rows past the tensors
        ctx.fail(("tasks",), f"{ctx.task_count} tasks for {ctx.tokens} tokens: one task per token row",
                 "set tasks: tokens")
    check_io(stage, ctx, hidden)
    ctx.lds(stage.name, "red", "float", 64)  # warp sums, total, per-wave amax
    return {"hidden": hidden, **checked_norm_constants(hidden, ctx, ("hidden",)), "fields": stage,
            "rdone": residual_done(stage, ctx)}


def residual_done(stage: Model, ctx) -> str | None:
    """The region of residual-written flags, in builds with ``signal`` on."""
    if stage.residual_done is None or not dict(ctx.build.params).get("signal", False):
        return None
    ctx.region(stage.residual_done, ("residual_done",), kind="pairs")
    return stage.residual_done


def check_io(stage: Model, ctx, hidden: int) -> None:
    """The stage's tensors and mailbox regions, as its row tasks index them:
    rows tk < tokens of [tokens, hidden] bf16, words tk * hidden / 4 .., pair tk."""
    row, tokens = (ctx.tokens, hidden), ctx.tokens
    for arg, loc, shape in ((stage.ar, "ar", row), (stage.res, "res", row), (stage.residual_out, "residual_out", row),
                            (stage.gamma, "gamma", (hidden,))):
        ctx.abi_arg(arg, (loc,), dtype="bf16", shape=shape, written=loc == "residual_out")
    ctx.region(stage.x8, ("x8",), kind="words", min_count=tokens * hidden // 4)
    ctx.region(stage.x8_scale, ("x8_scale",), kind="pairs", min_count=tokens)


def checked_norm_constants(hidden: int, ctx, loc: tuple) -> dict:
    """``norm_constants``, its refusal reported as a located spec error."""
    try:
        return norm_constants(hidden, ctx.threads)
    except ValueError as e:
        width = LTS_WIDTH * LOGICAL_WARP
        ctx.fail(loc, str(e), f"use a hidden size that is a multiple of {width} and at most {32 * width}")
