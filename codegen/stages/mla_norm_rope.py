"""Stage kind ``mla_norm_rope``: DeepSeek-V4.1's per-token step between the
two GEMVs (contract B.5.3, B.5.4), one task per token, or per two tokens
(``tokens_per_task`` 2: threads 0..255 take token 2u, 256..511 token 2u + 1,
at once, so that half as many CTAs hold the step).

The token's partials come in through every thread of the CTA: couples of
adjacent pairs (16-byte loads, coalesced across the warp), every K part
waited for at once, their bf16 sums into LDS (``vals``). Then 256 threads:
thread tt owns q columns ``8tt .. 8tt + 7`` (tt < Q_RANK / 8) and kv columns
``2tt, 2tt + 1``; threads 256.. take part in the barriers and shuffles only
(or, two tokens a task, are the second token's threads 0..255).

    v      = bf16(P_0 + P_1)                      the K halves' fp32 partials (f32 add); in 4 K
                                                  quarters bf16((P_0 + P_1) + (P_2 + P_3))
    ss_tt  = v0*v0 + v1*v1 + ...                  plain f32 mul then add, columns in order
    G_g    = butterfly 16, 8, 4, 2, 1 over the 32-lane group g (threads 32g ..)
    tot    = ((G0+G1)+(G2+G3))+((G4+G5)+(G6+G7))  q: groups of threads past 160 are 0
    r      = rsq(RN(tot / N) + EPS)               (sm90: correctly rounded; AMD v_rsq_f32)
    ys     = bf16((x * r) * f32(qn_w))            q_norm (plain RMSNorm weight, not 1 + w)
    kn     = bf16((x * r) * f32(kvn_w))           kv_norm

q: ys -> MXFP8 (``mx_quant8f``: a 32-block = 4 threads) -> QX8 words ``t *
Q_RANK/4 + 2tt``, codes ``t * Q_RANK/32 + tt/4``, then the QRDY flag of token t
(every copy). Index builds also store ``qr_out[t] = ys`` (bf16).

kv: GPT-J RoPE on dims NOPE.. (``e0 = bf16(kn0*c - kn1*s)``, ``e1 =
bf16(kn0*s + kn1*c)``, f32 mul / sub / add), the NoPE dims as they are; the
fp8_ds_mla record at ``slot`` (skipped when slot < 0): 64-dim NoPE block b =
threads 32b .. 32b + 31, ``rcode = ceil_exp(RN(max(amax, 1e-4) / FP8_MAX))``,
bytes ``fp8(clamp(e * 2^(127 - rcode), +-FP8_MAX))``; RoPE dims as bf16; the 7
codes and a zero pad byte in the block's scale row. QRDY is raised right after
QX8's stores (``early_ready``; only QX8 is waited on in this launch), or after
the record's. ``tagged``: QX8 and its codes are stored as tagged pairs (each
word with the launch's tag, in twice the words), which the consuming GEMV polls
themselves: no fence, no QRDY flag, no flag round trip before the rows. With
``publish`` false (the GEMV norms q itself from the
partials: gemv_mxfp8 ``q_inline``) neither QX8 nor QRDY is stored. The q
latent's math is the template macro ``mla_q_math``, which that GEMV emits too."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from ..spec.models import Expr, Name, PerTarget, StageBase, per_target
from .mxfp8_quant import MX_BLOCK, check_copies, image_groups, mx_fp8_max, writes_image

KIND = "mla_norm_rope"
STAMPED_POINTS = ("done_point",)
NORM_THREADS = 256
Q_PER_THREAD = 8
KV_PER_THREAD = 2
GROUP = 32  # lanes of a butterfly group, and of a record's 64-dim block
RECORD_BLOCK = 64
RECORD_SCALE_BYTES = 8  # 7 UE8M0 codes + a pad byte
RECORD_FLOOR = 1e-4  # amax floor of a record block
RED_FLOATS = 32  # a token's red[]: q group sums 0..7, kv group sums 8..15, record codes 16..


class Model(StageBase):
    kind: Literal["mla_norm_rope"]
    partials: Name  # pairs region: the wqkv GEMV's fp32 partials, (part * S + t) * (q_rank + kv_dim) + row
    k_parts: Expr = 2  # partials per value: K halves (contract B.5.2), or quarters summed pairwise
    q_rank: Expr = "Q_RANK"
    kv_dim: Expr = "KV_DIM"
    nope: Expr = "NOPE"  # kv dims before the RoPE dims
    eps: Expr = "EPS"
    out: Name  # words region: QX8
    codes: Name  # words region: QX8's E8M0 codes (int32)
    ready: Name  # flags region: token t's QX8 ready (per copy)
    copies: Expr = 1
    flag_stride: Expr
    index: Expr = "index"  # index builds: write qr_out
    # QRDY right after QX8's stores, before the record's (only QX8 is waited on in this launch;
    # H200 timeline, S = 16: wq_b's rows 15.1 -> 14.3 us, median); false: after the record
    early_ready: Expr = True
    # QX8, its codes and the QRDY flags (false where the consuming GEMV norms q itself from the
    # partials, gemv_mxfp8 q_inline: nothing in the launch waits for them)
    publish: Expr = True
    # QX8 and its codes as (word, tag) pairs in twice the words, each one its own ready flag:
    # the GEMV that reads them polls the pairs (no QRDY flags, no release fence before them). Not
    # with ``image`` (a TMA copy cannot check tags)
    tagged: Expr = False
    # tagged: the pairs stored this many times (copy c after c whole copies of QX8, of its
    # codes), so that a consumer CTA polls copy (CTA % copies): fewer CTAs poll each line. No
    # effect where QX8 is not tagged. H200: not measured yet
    tagged_copies: Expr = 1
    # tokens a task normalizes at once, NORM_THREADS threads each (1 or 2: the CTA's 512
    # threads); tasks: ceil(tokens / tokens_per_task)
    tokens_per_task: Expr = 1
    # ABI arguments (the seed's names)
    qn_w: Name = "qn_w"
    kvn_w: Name = "kvn_w"
    cos_sin: Name = "cos_sin"
    pos: Name = "pos"
    slot: Name = "slot"
    swa: Name = "swa"
    swa_stride: Name = "swa_stride"
    swa_block: Name = "swa_block"
    qr_out: Name = "qr_out"
    got_point: Name | None = None  # timeline point: thread 0 summed its couples of the CTA's first token's partials
    summed_point: Name | None = None  # timeline point: every thread's partials of the first token summed (the barrier after)
    norms_point: Name | None = None  # timeline point: the first token's q and kv sums of squares in (the barrier after)
    quant_point: Name | None = None  # timeline point: the first token's QX8 stored (before its flag)
    # QX8 stored as its consumer's LDS image per target (1 = on; sm90): the wgmma's
    # 128-byte-swizzled K-major layout of ceil(S / 8) 8-token groups (swizzle128_word, pad tokens
    # never written), so that each gemv_mxfp8 CTA takes every row with one TMA bulk copy (row
    # order through 16-byte loads: 1.5 / 2 us from the flags to the rows at S = 16 / 48; the copy
    # alone, 20 / 60 KB: 1.0 us by loads, 0.5-0.8 by TMA, scripts/broadcast_probe.py)
    image: PerTarget = PerTarget(default=0)

    _image = field_validator("image", mode="before")(classmethod(lambda cls, v: per_target(v)))

    def published(self) -> dict:
        """What a consumer reads: QX8 regions, one flag a token."""
        return {"words": self.out, "codes": self.codes, "ready": self.ready, "parts": 1,
                "copies": self.copies, "flag_stride": self.flag_stride}


def check_producer(stage: Model, ctx, width: int, parts: int) -> None:
    """The partials come from an earlier gemv_mxfp8 stage of this build (a
    wait on a later one, or on none, never ends) with ``partials`` epilogue
    into the same region, ``width`` = q_rank + kv_dim rows in ``parts`` K parts."""
    stages = ctx.loaded.spec.stages
    writers = [(i, w) for i, w in enumerate(stages) if w.kind == "gemv_mxfp8" and w.epilogue == "partials"
               and w.out == stage.partials and ctx.stage_active(w.name)]
    if not writers:
        ctx.fail(("partials",), f"no gemv_mxfp8 stage of this build writes partials into {stage.partials!r}",
                 "name the region its wqkv GEMV writes (epilogue: partials)")
    i, w = writers[0]
    if i > ctx.loc[1]:
        ctx.fail(("partials",), f"stage {w.name!r} writes {stage.partials!r} after this stage: a deadlock "
                 "(CTAs run stages in order)", "list the GEMV before this stage")
    rows, kp = ctx.integer(w.rows, ("partials",)), ctx.integer(w.k_parts, ("partials",))
    if (rows, kp) != (width, parts):
        ctx.fail(("partials",), f"stage {w.name!r} writes {rows} rows in {kp} K part(s) a token; this stage reads "
                 f"q_rank + kv_dim = {width} rows in {parts}", "make the GEMV's rows q_rank + kv_dim")


def q_math(stage: Model, ctx) -> dict:
    """The sizes of the q latent norm (template macro ``mla_q_math``), for this stage and for
    a gemv_mxfp8 that computes it itself."""
    parts = ctx.integer(stage.k_parts, ("k_parts",))
    if parts not in (2, 4):
        ctx.fail(("k_parts",), f"k_parts {parts}: the partials come in 2 K halves (contract B.5.2), or 4 quarters "
                 "summed pairwise into them", "use 2 or 4")
    return {"q_rank": ctx.integer(stage.q_rank, ("q_rank",)), "kv_dim": ctx.integer(stage.kv_dim, ("kv_dim",)),
            "eps": float(ctx.evaluate(stage.eps, ("eps",))), "parts": parts}


def lower(stage: Model, ctx) -> dict:
    """Template values: the thread layout's sizes, record layout, build switches."""
    qm = q_math(stage, ctx)
    q_rank, kv_dim = qm["q_rank"], qm["kv_dim"]
    nope = ctx.integer(stage.nope, ("nope",))
    parts = qm["parts"]
    if q_rank % (4 * Q_PER_THREAD) or q_rank > Q_PER_THREAD * NORM_THREADS:
        ctx.fail(("q_rank",), f"q_rank {q_rank}: whole 32-blocks over at most {NORM_THREADS} threads of {Q_PER_THREAD}")
    if kv_dim != KV_PER_THREAD * NORM_THREADS:
        ctx.fail(("kv_dim",), f"kv_dim {kv_dim} != {KV_PER_THREAD} x {NORM_THREADS} threads")
    if nope % RECORD_BLOCK or not 0 < nope < kv_dim:
        ctx.fail(("nope",), f"nope {nope}: whole {RECORD_BLOCK}-dim record blocks below kv_dim expected")
    if (nope // RECORD_BLOCK) >= RECORD_SCALE_BYTES:
        ctx.fail(("nope",), f"{nope // RECORD_BLOCK} record blocks do not fit {RECORD_SCALE_BYTES - 1} code bytes")
    per_task = ctx.integer(stage.tokens_per_task, ("tokens_per_task",), minimum=1)
    if per_task > 2 or ctx.threads < per_task * NORM_THREADS:
        ctx.fail(("tokens_per_task",), f"{per_task} tokens a task need {per_task * NORM_THREADS} threads "
                 f"({NORM_THREADS} a token), the grid has {ctx.threads}", "use 1 or 2 within the grid's threads")
    s = ctx.tokens
    tasks = -(-s // per_task)
    if ctx.task_count != tasks:
        ctx.fail(("tasks",), f"one task per {per_task} token(s) expected: {tasks} at {s} tokens, "
                 f"got {ctx.task_count}", "set tasks to ceil_div(tokens, tokens_per_task)")
    ctx.region(stage.partials, ("partials",), kind="pairs", min_count=parts * s * (q_rank + kv_dim))
    check_producer(stage, ctx, q_rank + kv_dim, parts)
    publish = bool(ctx.evaluate(stage.publish, ("publish",)))
    image = writes_image(stage, ctx) and publish
    if image and q_rank % 128:
        ctx.fail(("q_rank",), f"q_rank {q_rank}: the image's rows are whole 128-byte segments", "turn image off")
    tagged = ctx.switch(stage.tagged, ("tagged",)) and publish
    if tagged and image:  # (a consumer reads this lowering's "tagged")
        ctx.fail(("tagged",), "tagged QX8 pairs and the LDS image are two layouts of QX8 (the image is taken by "
                 "one TMA copy, which cannot check tags)", "turn image or tagged off for this build")
    # the image: whole 8-token groups (a consumer's bulk copy reads the pad tokens' bytes too);
    # tagged: two words (a pair) a word, in tagged_copies copies
    copies_tagged = ctx.integer(stage.tagged_copies, ("tagged_copies",)) if tagged else 1
    words = (1 + tagged) * copies_tagged
    ctx.region(stage.out, ("out",), kind="words", min_count=(8 * image_groups(s) if image else s) * q_rank // 4 * words)
    ctx.region(stage.codes, ("codes",), kind="words", min_count=s * q_rank // MX_BLOCK * words)
    ctx.region(stage.ready, ("ready",), kind="pairs")
    copies, stride = check_copies(stage, ctx, s)
    for f, dtype, shape in (("qn_w", "bf16", (q_rank,)), ("kvn_w", "bf16", (kv_dim,)),
                            ("cos_sin", "f32", (None, kv_dim - nope)), ("pos", "i64", (s,)), ("slot", "i64", (s,))):
        ctx.abi_arg(getattr(stage, f), (f,), dtype=dtype, shape=shape)
    ctx.abi_arg(stage.swa, ("swa",), dtype="u8", shape=(None,), written=True)  # bytes at slots read from data
    ctx.abi_arg(stage.swa_stride, ("swa_stride",), dtype="i64", scalar=True)
    ctx.abi_arg(stage.swa_block, ("swa_block",), dtype="i32", scalar=True, within=(1, None))  # a divisor
    ctx.abi_arg(stage.qr_out, ("qr_out",), dtype="bf16", shape=(s, q_rank), written=True)
    ctx.lds(stage.name, "red", "float", RED_FLOATS * per_task)  # (the 7 codes at most: the nope check above)
    ctx.lds(stage.name, "vals", "float", per_task * (q_rank + kv_dim))  # a token's bf16 qkv (partials summed), as f32
    rope = kv_dim - nope
    return {
        "q_math": qm,
        "nope": nope,
        "per_task": per_task,
        "red_floats": RED_FLOATS,
        "rope": rope,
        "record_data": nope + 2 * rope,
        "record_blocks": nope // RECORD_BLOCK,
        "index": bool(ctx.evaluate(stage.index, ("index",))),
        "early_ready": bool(ctx.evaluate(stage.early_ready, ("early_ready",))),
        "publish": publish,
        "image_groups": image_groups(s) if image else 0,  # 0: row-major QX8 (token t at word t * q_rank / 4)
        "tagged": tagged,  # QX8 and codes as tagged pairs (pair i: word i of the untagged layout)
        "tagged_copies": copies_tagged,  # ... stored this many times, one after the other
        "copy_pairs": s * q_rank // 4,  # a copy's pairs of QX8 (tagged)
        "copy_code_pairs": s * q_rank // MX_BLOCK,  # ... of its codes
        "copies": copies,
        "flag_stride": stride,
        "mx_fp8_max": mx_fp8_max(ctx.target),
        "fields": stage,
    }
