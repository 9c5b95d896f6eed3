"""Stage kind ``mxfp8_quant``: bf16 rows -> MXFP8 (E4M3 bytes + one E8M0 code
per 32 values) into a words mailbox, each (token, K part) unit published by a
ready flag.

The quantization is vLLM ROCm's ``mxfp8_quantize`` bit rule (contract B.4),
per 32-value block: ``code = clamp(ceil_exp(RN(max(amax, FLT_MIN) / FP8_MAX)),
0, 254)`` (``ceil_exp``: the biased exponent field, +1 if any mantissa bit is
set), ``byte = fp8(clamp(v * 2^(127 - code), +-FP8_MAX))`` RNE. A thread holds
8 values (one 16-byte load); a block is 4 consecutive lanes (amax butterflied
over lane offsets 1, 2). FP8_MAX is the MX maximum of the target's flavour
(``MX_FP8_MAX``): 448 for OCP e4m3fn, 224 for gfx942's FNUZ, whose bytes are
then the OCP bytes with codes one higher (Decisions 1 and 2).

Units ``u = t * PARTS + part`` (token t, K part ``part``); a CTA issues all
its units' loads before it quantizes any (one round trip, not one a unit:
H200, DeepSeek S = 48 with 10 units a CTA, rows 3.6 us later without); unit u's words go
to word ``t * K / 4 + part * KP / 4`` (KP = K / PARTS), its codes to word
``t * K / 32 + part * KP / 32``; once the CTA's stores are drained, flag pair
``copy * FLAG_STRIDE + u`` is raised for every copy (tuned builds keep
``COPIES`` copies, each in its own 256-byte stretch, so that pollers spread
over several lines: CTA b polls copy ``b % COPIES``).

``image`` (sm90): the words go where the consuming wgmma GEMV keeps them in LDS instead, its
128-byte-swizzled K-major layout of ``ceil(S / 8)`` 8-token groups (``swizzle128_word``, the
layout of mla_norm_rope's QX8 image). A K part of whole 128-byte segments is then one
contiguous stretch of it, so each consumer CTA takes its part's rows with one TMA bulk copy."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from ..spec.models import Expr, Name, PerTarget, StageBase, per_target

KIND = "mxfp8_quant"
STAMPED_POINTS = ("done_point",)
MX_BLOCK = 32  # values per E8M0 code
ITEM = 8  # values per thread item: one 16-byte bf16 load
MAX_UNITS_PER_CTA = 16  # a CTA's unit loads are all in flight at once: 4 registers a unit
MX_FP8_MAX = {"ocp": 448.0, "fnuz": 224.0}  # the MX quantizers' maximum per FP8 flavour


def mx_fp8_max(target) -> float:
    """The MX quantizers' FP8_MAX on ``target``: 448 (OCP e4m3fn), 224 (gfx942
    FNUZ: the same bytes as OCP at 448, codes one higher)."""
    return MX_FP8_MAX[target.fp8_flavour]


class Model(StageBase):
    kind: Literal["mxfp8_quant"]
    x: Name = "x"  # ABI bf16 [tokens, K]: the rows to quantize
    x_stride: Name = "x_stride"  # ABI i32: elements between rows of x
    k: Expr = "HIDDEN"  # values per row
    parts: Expr = 1  # K parts: one unit (and one flag) per (token, part)
    out: Name  # words region: the e4m3 bytes, K / 4 words a token
    codes: Name  # words region: one int32 code per 32 values, K / 32 a token
    ready: Name  # flags region: unit u's flag (per copy)
    copies: Expr = 1  # copies of every flag
    flag_stride: Expr  # pairs between two copies of the flags (>= units)
    # the words stored as the consumer's LDS image per target (1 = on; sm90): wgmma's 128-byte-
    # swizzled K-major layout of ceil(S / 8) 8-token groups (swizzle128_word, pad tokens never
    # written), so that a gemv_mxfp8 CTA takes its K part's rows with one TMA bulk copy
    image: PerTarget = PerTarget(default=0)

    _image = field_validator("image", mode="before")(classmethod(lambda cls, v: per_target(v)))

    def published(self) -> dict:
        """What a consumer reads: regions, flag layout (``index = t * parts + part``)."""
        return {"words": self.out, "codes": self.codes, "ready": self.ready, "parts": self.parts,
                "copies": self.copies, "flag_stride": self.flag_stride}


def check_copies(stage, ctx, units: int) -> tuple[int, int]:
    """(copies, flag_stride) of a publishing stage, checked against its flags region."""
    copies = ctx.integer(stage.copies, ("copies",))
    stride = ctx.integer(stage.flag_stride, ("flag_stride",))
    if stride < units:
        ctx.fail(("flag_stride",), f"flag_stride {stride} < {units} flags", "use at least one pair per flag")
    if copies > 1 and (stride * 8) % 256:
        ctx.fail(("flag_stride",), f"{copies} copies {stride} pairs apart do not start on 256-byte stretches",
                 "round flag_stride up to a multiple of 32 pairs")
    region = next(r for r in ctx.loaded.spec.scratch if r.name == stage.ready)
    count = ctx.integer(region.count, ())
    if count < copies * stride:
        ctx.fail(("ready",), f"flags region {stage.ready!r} holds {count} pairs, {copies} copies need {copies * stride}",
                 "size it copies * flag_stride")
    return copies, stride


def writes_image(stage, ctx) -> bool:
    """Whether the build stores a publishing stage's words as the consumer's LDS image (its
    ``image``: this kind's and mla_norm_rope's); errors at the stage's own line whoever asks."""
    here, ctx.loc = ctx.loc, ("stages", [s.name for s in ctx.loaded.spec.stages].index(stage.name))
    on = ctx.switch(stage.image.for_target(ctx.target.name), ("image",))
    if on and ctx.target.name != "sm90":
        ctx.fail(("image",), f"the image is sm90 wgmma's swizzled layout; target {ctx.target.name} has no wgmma",
                 "turn image on for sm90 only")
    ctx.loc = here
    return on


def image_groups(tokens: int) -> int:
    """8-token groups of an image (a K part's byte count: 8 x this x the part's values)."""
    return -(-tokens // 8)


def check_rows(stage, ctx, k: int) -> None:
    """The rows an MX quantizer reads: ``x`` bf16 [tokens, k], row ``t`` at
    ``t * x_stride``: x_stride must be k (the launcher checks x contiguous;
    a larger stride reads past its end)."""
    ctx.abi_arg(stage.x, ("x",), dtype="bf16", shape=(ctx.tokens, k))
    ctx.abi_arg(stage.x_stride, ("x_stride",), dtype="i32", scalar=True, within=(k, k))


def lower(stage: Model, ctx) -> dict:
    """Template values: the unit layout, items per unit, the flag copies."""
    k = ctx.integer(stage.k, ("k",))
    parts = ctx.integer(stage.parts, ("parts",))
    if k % (parts * MX_BLOCK):
        ctx.fail(("parts",), f"K = {k} does not split into {parts} parts of whole {MX_BLOCK}-value blocks")
    kp = k // parts
    items = kp // ITEM
    if items > ctx.threads:
        ctx.fail(("k",), f"a unit of {kp} values needs {items} > {ctx.threads} threads of {ITEM} values")
    units = parts * ctx.tokens
    if ctx.task_count != units:
        ctx.fail(("tasks",), f"{ctx.task_count} tasks != tokens x parts = {units}", "set tasks to parts * tokens")
    upc = -(-units // ctx.stage_ctas)
    if upc > MAX_UNITS_PER_CTA:
        ctx.fail(("placement",), f"{upc} units a CTA: a CTA holds all its units' loads at once (at most "
                 f"{MAX_UNITS_PER_CTA}, 4 registers each)", "place the stage on more CTAs")
    check_rows(stage, ctx, k)
    image = writes_image(stage, ctx)
    if image and kp % 128:
        ctx.fail(("parts",), f"a K part of {kp} values: the image's rows are whole 128-byte segments",
                 "turn image off, or use parts of a multiple of 128 values")
    groups = image_groups(ctx.tokens) if image else 0
    ctx.region(stage.out, ("out",), kind="words", min_count=(8 * groups if image else ctx.tokens) * k // 4)
    ctx.region(stage.codes, ("codes",), kind="words", min_count=ctx.tokens * k // MX_BLOCK)
    ctx.region(stage.ready, ("ready",), kind="pairs")
    copies, stride = check_copies(stage, ctx, units)
    return {
        "k": k,
        "kp": kp,
        "parts": parts,
        "n_items": items,
        "image_groups": groups,  # 0: row-major words (token t at word t * K / 4)
        "copies": copies,
        "flag_stride": stride,
        "mx_fp8_max": mx_fp8_max(ctx.target),
        "fields": stage,
    }
