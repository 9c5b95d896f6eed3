"""Stage kind ``gemv_mxfp8``: MXFP8 activations times an MXFP8 weight (E4M3
bytes, one E8M0 code per 32 x 32 block), 16 rows a unit, per-block scales
applied in f32 (contract B.5.2, B.5.5).

Units: ``n = part * ROW_TILES + tile`` (rows ``16 tile ..``, K part ``part``
of ``k_parts``). The tasks go round robin over the stage's CTAs, and a CTA's
tasks compute consecutive units (template ``unit_of``), so they share their K
part: the token rows are staged once a part, not once a unit. A CTA issues its
first units' weight loads before it waits on anything, and each next unit's
while it computes the current one. Token rows come into LDS in batches of
``row_batch`` 16-byte loads a thread (one L2 round trip a batch).

The inner loop (device library ``mx_gemv16_partial``) splits a unit's K into
chunks of one 16-byte weight load per lane (sm90: 32 k = one MX block, for
``mma.sync m16n8k32``; AMD: 64 k = two blocks, two ``mfma 16x16x32``); warp
w takes chunks ``w, w + WAVES, ...`` in that order. Per block, per token
column (f32, each step rounded; the MMA's own order inside a block):

    d   = mma(w_block, x_block, 0)
    acc = acc + (d * 2^(sx - 127)) * 2^(sw - 127)

then ``P = sum over warps in warp order`` (starting from 0.0). Epilogues:

* ``partials``: P as f32 into a pairs region at ``(part * S + t) * ROWS + row``.
* ``rope_bf16``: ``v = bf16(P)``; rows at head dims >= NOPE get GPT-J RoPE per
  row pair (``e0 = v0*c - v1*s, e1 = v0*s + v1*c``, f32, no fma), then bf16
  into the ABI tensor at ``t * ROWS + row``.

gfx950's scaled MFMA (``v_mfma_scale_f32_16x16x128_f8f6f4``, E8M0 scales in
the instruction) compiles with clang 22 from ziglang (checked with a small
kernel), but its operand and scale-lane layout cannot be validated without the
hardware; both AMD targets use the 16x16x32 path, whose result the same
reference bounds.

The activations come from the stage named by ``x_from``: an ``mxfp8_quant``
stage's words after its flags, or, when that stage is not in the build, x
quantized by the GEMV CTA itself (every token of its K part, into LDS; the
same bits); or an ``mla_norm_rope`` stage's QX8 after its flags, or, with
``q_inline``, QX8 computed by the GEMV CTA itself from that stage's partials
(template macro ``mla_q_math``, shared with the stage: the same bits)."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from ..spec.models import Expr, Name, PerTarget, StageBase, per_target
from . import mla_norm_rope, mxfp8_quant
from .gemv_fp8 import K_CHUNK, LAUNCH, part_row, row_batch
from .mxfp8_quant import MX_BLOCK, check_rows, mx_fp8_max

KIND = "gemv_mxfp8"
STAMPED_POINTS = ("done_point",)
ROWS_PER_UNIT = 16  # one MMA tile of output rows
ROW_PAD_WORDS = 4  # LDS row padding: token rows land on different banks
SCALE_PAD = 4
SOURCES = ("mxfp8_quant", "mla_norm_rope")
# 16-byte weight loads per lane kept in flight: a CTA issues the weights of as many of its
# units as fit (at least one) before it waits on anything. 12 x 4 registers: every unit of
# a CTA at TP4 (wq_b: 4 units x 3 chunks on sm90), half of them at TP2 (within 128 registers).
PREFETCH_LOADS = 12
PIECE = 128  # values of a K part: whole 16-byte loads of X8 words (16 values) and of E8M0 codes (4 x 32 values)


class Model(StageBase):
    kind: Literal["gemv_mxfp8"]
    weight: Name  # ABI fp8 [rows, k], MX-preshuffled for the target (codegen.weights.preshuffle_mx)
    weight_scale: Name  # ABI u8 [rows / 32, k / 32]: E8M0 codes
    rows: Expr
    k: Expr
    k_parts: Expr = 1  # K split: units per row tile
    x_from: Name  # the stage publishing the activations (mxfp8_quant or mla_norm_rope)
    epilogue: Literal["partials", "rope_bf16"]
    out: Name  # partials: pairs region; rope_bf16: ABI bf16 tensor [tokens, .., rows]
    head_dim: Expr = "HEAD_DIM"  # rope_bf16: rows per head
    nope: Expr = "NOPE"  # rope_bf16: head dims before the RoPE dims
    cos_sin: Name = "cos_sin"  # rope_bf16: ABI f32 [positions, 64]
    pos: Name = "pos"  # rope_bf16: ABI i64 [tokens]
    token_tile: PerTarget = PerTarget(default=48)  # token rows resident in LDS
    # ILP inner loop per target (1 = on; sm90): a warp loads all its chunks' operands first and
    # keeps the chunks independent until the accumulation (same order: the same bits), so the
    # emulated fp8 MMAs overlap instead of running one after another
    ilp: PerTarget = PerTarget(default=0)
    # kernel-start weights per target (1 = on; sm90, with ilp, k_parts 1): the weights of a CTA's
    # first units (as many as fit) travel as TMA bulk copies issued at the kernel's start into
    # LDS no stage reuses, so they land while earlier stages run; those units are computed
    # `group` at a time (one barrier and one epilogue pass a group)
    bulk_weights: PerTarget = PerTarget(default=0)
    # stage-start weights per target (1 = on; sm90, with ilp, k_parts 1): as bulk_weights, but
    # the copies are issued when the stage starts, into its own LDS (the scale codes too, by
    # cp.async): they stream while the CTA waits for its token rows, and no load of theirs holds
    # a register or a load scoreboard that the rows' polls share
    lds_weights: PerTarget = PerTarget(default=0)
    # native fp8 wgmma per target (1 = on; sm90, 4 or 8 units a CTA): a warpgroup's 4 warps take 4
    # of the CTA's units (a group) of one chunk, the 4 warpgroups a quarter of the chunks each; the
    # next group's weights load as the group's last pass frees their registers; the activations in
    # LDS in a K-major layout (core matrices; 128-byte-swizzled when copied from a mailbox). The
    # tensor cores keep about 13 bits of a chunk's sum (up to 2^-12.8 of sum |w x|): sm90's fp8
    # tensor-core precision class (README "Precision")
    wgmma: PerTarget = PerTarget(default=0)
    # wgmma: a warp's chunks in flight on the tensor cores (2..4): each chunk is one 32-value
    # block with its own scale, so its wgmma writes fresh registers that are scaled into the sums
    # after its wait; with depth d the loop waits for chunk i while chunks i + 1 .. i + d - 1 run
    # (4 d-value register sets a lane at 8 tokens and below, 8 above). No effect on the mma.sync loops
    wgmma_depth: PerTarget = PerTarget(default=2)
    # the wgmma loop's first group of weight loads issued after the token rows are in LDS (1), not
    # before the rows' wait, so that no load of theirs holds a scoreboard the rows' loads share.
    # The mma.sync loops keep their own load order (ilp, bulk_weights, lds_weights): no effect there
    late_weights: PerTarget = PerTarget(default=0)
    # the CTA's units' weights and scale codes into L2 (1 = on; NVIDIA: TMA prefetch, no register,
    # no LDS, no scoreboard) as the CTA enters stage l2_prefetch_at (an earlier one), so that the
    # stage's own loads, issued when it starts, come from L2: for a CTA whose earlier stages take
    # long (the qkv stage's CTAs), its weights stream meanwhile. At the kernel's start they
    # competed with the first stage's weights (H200: every S 1.1-2.3 us slower, bench/NOTES.md).
    # l2_prefetch_at `launch`: before the kernel waits for the previous launch's end (programmatic
    # dependent launch), so that a CTA resident before that end (one launched without the
    # cooperative attribute, on an SM the previous launch left early) streams its weights
    # meanwhile; a prefetch only warms L2, so it reads nothing the previous launch may still write
    l2_prefetch: PerTarget = PerTarget(default=0)
    l2_prefetch_at: Name | None = None  # l2_prefetch: the stage before whose run the kernel issues it (not in a build: the next one that is), or launch
    # token rows from the source's mailbox into LDS by cp.async (1 = on; NVIDIA), as the codes are,
    # not by 16-byte loads through registers: no register sits between L2 and LDS, so the copy
    # waits on no scoreboard the CTA's weight loads share (from S = 9 the sm90 SASS held wqkv's X8
    # copy for its CTA's 20 weight loads). No effect where the rows come otherwise (inline,
    # q_inline, one TMA copy of an image)
    rows_async: PerTarget = PerTarget(default=0)
    # mla_norm_rope source: the CTAs norm and quantize the q latent themselves from the source's
    # partials (template macro mla_q_math, the same bits as its QX8) instead of waiting for QX8:
    # one hand-off less (the source's QX8 store, fence and flag, this stage's flag poll and row
    # copy); every CTA reads every token's q partials, so for few tokens only
    q_inline: Expr = False
    # a source that publishes tagged pairs (mla_norm_rope tagged), whose rows each thread polls:
    # on, a poll round loads only the thread's pieces not yet tagged, none past the CTA's pieces;
    # off, every slot each round, a slot past them on the CTA's last piece (as the copies repeat
    # it). H200, TP4 S = 6: 128 CTAs' polls slowed the qkv stage by 1 us (bench/NOTES.md, session
    # 25); on: -0.05..-0.4 us at some S, +0.2..+0.5 at others (session 26). No effect where the
    # rows are not tagged pairs
    pending_polls: Expr = False
    # tagged rows: ns a thread sleeps after a poll round that saw an untagged pair (0: the
    # target's pause(), 64 ns on sm90; AMD sleeps in 64-clock units, up to 127). Longer: fewer
    # polls in flight while the source still works, a later sight of the rows. H200, TP4 S = 1..15,
    # 256 and 1000 ns: within +-0.15 us of 64 but at S = 6 with two tokens a qkv task (13.25 ->
    # 12.73 / 12.71; one token a task is faster still: bench/NOTES.md DeepSeek session 26)
    poll_sleep: Expr = 0
    flags_point: Name | None = None  # timeline point: the CTA's first token rows' flags seen (before their copy)
    rows_point: Name | None = None  # timeline point: the CTA's first token rows in LDS
    unit_point: Name | None = None  # timeline point: the CTA's first unit (bulk: group) put
    mma_point: Name | None = None  # timeline point: wgmma builds, warp 0's MMAs of the first pass done (before its epilogue)
    weights_point: Name | None = None  # timeline point: bulk_weights / lds_weights: the staged copies landed

    _tile = field_validator("token_tile", "ilp", "bulk_weights", "lds_weights", "wgmma", "wgmma_depth", "late_weights",
                           "l2_prefetch", "rows_async", mode="before")(
        classmethod(lambda cls, v: per_target(v)))


def _l2_prefetch_at(stage: Model, ctx) -> str:
    """The build's stage before which the kernel issues this stage's L2 prefetch: l2_prefetch_at,
    an earlier stage of the spec, or (not in this build) the first of the build's stages after it."""
    names = [s.name for s in ctx.loaded.spec.stages]
    ctx.nvidia_only(("l2_prefetch",), "L2 prefetch")
    at = stage.l2_prefetch_at
    if at == LAUNCH:
        return at
    if at is None or at not in names or names.index(at) >= names.index(stage.name):
        ctx.fail(("l2_prefetch_at",), f"l2_prefetch needs the earlier stage it starts with, got {at!r}",
                 f"name one of {', '.join(names[:names.index(stage.name)] + [LAUNCH])}")
    return next(n for n in names[names.index(at):] if ctx.stage_active(n))


def unit_of(task: int, tasks: int, ctas: int) -> int:
    """The unit task ``task`` computes (the template's ``unit_of``): a CTA's tasks take
    consecutive units, CTA c from c (tasks // ctas) + min(c, tasks % ctas)."""
    c = task % ctas
    return c * (tasks // ctas) + min(c, tasks % ctas) + task // ctas


def _group_spans_parts(tasks: int, ctas: int, row_tiles: int, group: int) -> bool:
    """Whether some CTA's group of `group` consecutive units (its i-th .. i + group - 1-th)
    holds units of two K parts."""
    for c in range(ctas):
        mine = [unit_of(u, tasks, ctas) // row_tiles for u in range(c, tasks, ctas)]
        if any(len(set(mine[i:i + group])) > 1 for i in range(0, len(mine), group)):
            return True
    return False


def _lds_size(words: int) -> int:
    """LDS bytes of a 4-byte-element buffer as the layout packs it (16-byte aligned)."""
    return -(-words * 4 // 16) * 16


def lower(stage: Model, ctx) -> dict:
    """Template values: unit layout, chunks per wave, LDS tiles, the source."""
    t = ctx.target
    rows = ctx.integer(stage.rows, ("rows",))
    k = ctx.integer(stage.k, ("k",))
    parts = ctx.integer(stage.k_parts, ("k_parts",))
    chunk = K_CHUNK[t.vendor]
    if rows % 32:
        ctx.fail(("rows",), f"rows = {rows} is not a multiple of 32 (the weight's scale blocks)")
    if k % (parts * chunk):
        ctx.fail(("k_parts",), f"K = {k} does not split into {parts} parts of whole {chunk}-k chunks")
    if k % parts == 0 and (k // parts) % PIECE:
        ctx.fail(("k",), f"a K part of {k // parts} values is not whole {PIECE}-value pieces "
                 "(16-byte loads of its X8 words and of 4 E8M0 codes)")
    units = rows // ROWS_PER_UNIT * parts
    if ctx.task_count != units:
        ctx.fail(("tasks",), f"{ctx.task_count} tasks != (rows / 16) x k_parts = {units}",
                 "set tasks to rows // 16 * k_parts")
    kp = k // parts
    nc = kp // chunk
    waves = ctx.threads // t.wave_size
    ctx.abi_arg(stage.weight, ("weight",), dtype="fp8", shape=(rows, k))
    ctx.abi_arg(stage.weight_scale, ("weight_scale",), dtype="u8", shape=(rows // MX_BLOCK, k // MX_BLOCK))

    src = next((s for s in ctx.loaded.spec.stages if s.name == stage.x_from), None)
    if src is None or src.kind not in SOURCES:
        ctx.fail(("x_from",), f"no stage {stage.x_from!r} of kind {' or '.join(SOURCES)}",
                 "name the stage that publishes the activations")
    src_loc = ("stages", [s.name for s in ctx.loaded.spec.stages].index(src.name))  # its errors' location
    if src_loc[1] > ctx.loc[1]:  # a wait on work queued behind it
        ctx.fail(("x_from",), f"stage {src.name!r} comes after this stage: a deadlock (CTAs run stages in order)",
                 "list the source stage before its GEMV")
    pub = src.published()
    inline = not ctx.stage_active(src.name)
    if inline and src.kind != "mxfp8_quant":
        ctx.fail(("x_from",), f"stage {src.name!r} is not in this build and only an mxfp8_quant source can be inlined")
    q_inline = bool(ctx.evaluate(stage.q_inline, ("q_inline",)))
    if q_inline and src.kind != "mla_norm_rope":
        ctx.fail(("q_inline",), f"stage {src.name!r} is of kind {src.kind}: only an mla_norm_rope source's q latent "
                 "can be normed here", "set q_inline false")
    if src.kind == "mla_norm_rope" and not q_inline and ctx.stage_active(src.name) \
            and not ctx.evaluate(src.publish, ("x_from",)):
        ctx.fail(("x_from",), f"stage {src.name!r} does not publish QX8 in this build (publish false), so this "
                 "stage would wait for it forever", "set q_inline for the same builds as the source's publish is false")
    src_k = ctx.integer(src.k if src.kind == "mxfp8_quant" else src.q_rank, ("x_from",))
    src_parts = ctx.integer(pub["parts"], ("x_from",))
    if src_k != k or src_parts not in (1, parts):
        ctx.fail(("x_from",), f"stage {src.name!r} publishes rows of {src_k} values in {src_parts} part(s); "
                 f"this GEMV needs {k} values in {parts}")
    copies = ctx.integer(pub["copies"], ("x_from",))
    flag_stride = ctx.integer(pub["flag_stride"], ("x_from",))

    tokens = ctx.tokens
    tile = min(tokens, ctx.integer(stage.token_tile.for_target(t.name), ("token_tile",)))
    if (inline or q_inline) and tile < tokens:
        ctx.fail(("token_tile",), f"quantizing x here needs every token in LDS ({tile} < {tokens})",
                 "raise token_tile or let the quant stage run for this build")
    q_math, norm_par = {}, 0
    if q_inline:  # the source's partials and q_norm weight, reported at its lines
        here, ctx.loc = ctx.loc, src_loc
        q_math = mla_norm_rope.q_math(src, ctx)
        mla_norm_rope.check_producer(src, ctx, q_math["q_rank"] + q_math["kv_dim"], q_math["parts"])
        ctx.loc = here
        if parts != 1:
            ctx.fail(("k_parts",), "q_inline norms whole q rows: k_parts 1 needed")
        norm_par = ctx.threads // (q_math["q_rank"] // mla_norm_rope.Q_PER_THREAD)  # tokens normed at once
        ctx.lds(stage.name, "qv", "float", tokens * q_math["q_rank"])  # every token's bf16(P_0 + P_1) of q
        ctx.lds(stage.name, "qred", "float", 8 * norm_par)  # the group sums of the tokens normed at once
    if inline:  # this stage quantizes x itself: the source's bindings, reported at its lines
        here, ctx.loc = ctx.loc, src_loc
        check_rows(src, ctx, k)
        ctx.loc = here
    xstride = kp // 4 + ROW_PAD_WORDS
    sstride = kp // MX_BLOCK + SCALE_PAD
    head_dim = ctx.integer(stage.head_dim, ("head_dim",)) if stage.epilogue == "rope_bf16" else 0
    nope = ctx.integer(stage.nope, ("nope",), minimum=0) if stage.epilogue == "rope_bf16" else 0
    cpw = -(-nc // waves)
    upc = -(-units // ctx.stage_ctas)
    ilp, bulk, lds_w = (ctx.switch(getattr(stage, f).for_target(t.name), (f,))
                        for f in ("ilp", "bulk_weights", "lds_weights"))
    knob = "bulk_weights" if bulk else "lds_weights"
    if ilp or bulk or lds_w:
        ctx.nvidia_only(("ilp" if ilp else knob,), "ILP MXFP8 loop / bulk copies")
    if bulk and lds_w:
        ctx.fail(("lds_weights",), "bulk_weights already moves the weights into LDS (at the kernel's start)",
                 "turn one of bulk_weights / lds_weights off")
    if (bulk or lds_w) and not ilp:
        ctx.fail((knob,), "the staged weights are read by the ILP loop", "turn ilp on for this target")
    if (bulk or lds_w) and parts != 1:
        ctx.fail((knob,), "a group of units shares its activations: whole rows (k_parts: 1) needed",
                 f"turn {knob} off for this stage")
    wgmma = ctx.switch(stage.wgmma.for_target(t.name), ("wgmma",))
    groups = waves // 4  # warpgroups
    if wgmma:
        why = [r for r, bad in (
            (f"target {t.name} (sm90 only)", t.name != "sm90"),
            (f"{knob} on (the wgmma loop takes its weights in registers)", bulk or lds_w),
            ("a CTA's units over two K parts (they share its token rows)",
             _group_spans_parts(units, ctx.stage_ctas, rows // ROWS_PER_UNIT, upc)),
            (f"{upc} units a CTA (one a warp of each warpgroup: a multiple of 4 needed)", upc % 4),
            (f"a token tile of {tile} < {tokens} tokens (every row in LDS once needed)", tile < tokens),
            (f"{nc} chunks do not split over {groups} warpgroups", nc % groups)) if bad]
        if why:
            ctx.fail(("wgmma",), "the wgmma loop cannot run this build: " + "; ".join(why),
                     "turn wgmma off for this build")
        cpw = nc // groups
    depth = ctx.integer(stage.wgmma_depth.for_target(t.name), ("wgmma_depth",))
    if not 2 <= depth <= 4:
        ctx.fail(("wgmma_depth",), f"{depth} chunks in flight: 2, 3 or 4 (each holds 4 or 8 registers "
                 "a lane; the loop's last waits take 0..3 pending)", "set wgmma_depth to 2, 3 or 4")
    late = ctx.switch(stage.late_weights.for_target(t.name), ("late_weights",)) and wgmma
    l2_at = _l2_prefetch_at(stage, ctx) if ctx.switch(stage.l2_prefetch.for_target(t.name), ("l2_prefetch",)) else None
    rows_async = ctx.switch(stage.rows_async.for_target(t.name), ("rows_async",))
    if rows_async:
        ctx.nvidia_only(("rows_async",), "asynchronous global-to-LDS copy")
    if stage.flags_point and (inline or q_inline):
        ctx.fail(("flags_point",), "flags_point stamps the wait for the source's flags; this build computes its rows "
                 "itself (" + ("q_inline" if q_inline else f"no {src.name} stage") + ")", "use rows_point here")
    if stage.mma_point and not wgmma:
        ctx.fail(("mma_point",), "mma_point stamps the wgmma loop's first pass; this build runs the mma.sync loop",
                 "use unit_point here, or turn wgmma on")
    tile_bytes = waves * ROWS_PER_UNIT * part_row(t) * 4  # one unit's partial tiles
    own = [_lds_size(tile * xstride), _lds_size(tile * sstride), 0, _lds_size(tokens * (head_dim - nope))]
    staged, group, lds_scales = 0, 1, False
    prefetch = max(1, PREFETCH_LOADS // cpw)  # units whose weights are issued before any wait
    token_groups = -(-tile // 8)  # wgmma: 8-token groups of the LDS rows (the swizzled atoms)
    halves = 2 if tile > 8 else 1  # token halves of a pass (an mma each): registers per chunk
    unit_bytes = nc * ROWS_PER_UNIT * chunk
    # the scale rows n consecutive units span at most (the first may start mid-block)
    code_rows = lambda n: (ROWS_PER_UNIT * n + ROWS_PER_UNIT - 1) // MX_BLOCK + 1  # noqa: E731
    if bulk:  # as many units as fit beside the union (this stage's with one part tile) and the mbarrier
        others = ctx.lds_left(stage.name) - ctx.lds_kernel_left()  # the other stages' union so far
        room = ctx.lds_left(stage.name) - 16  # for the union and the weights, less the mbarrier
        fits = lambda n, g: max(others, sum(own) + g * tile_bytes) + n * unit_bytes <= room  # noqa: E731
    elif lds_w:  # as many units (and their scale rows) as fit beside the stage's own buffers and the mbarrier
        room = ctx.lds_left(stage.name) - 16
        fits = lambda n, g: (sum(own) + g * tile_bytes + n * unit_bytes  # noqa: E731
                             + _lds_size(code_rows(n) * (k // MX_BLOCK) // 4) <= room)
    if bulk or lds_w:
        staged = max((n for n in range(upc + 1) if fits(n, 1)), default=0)
        if staged == 0:
            where = (f"beside the stages' union of {max(others, sum(own) + tile_bytes)} B" if bulk
                     else f"in the {room - sum(own) - tile_bytes} B the stage's other buffers leave")
            ctx.fail((knob,), f"not one unit's weights ({unit_bytes} B) fit in LDS {where}",
                     f"turn {knob} off for this build")
        regs = PREFETCH_LOADS - (cpw if staged < upc else 0)  # less a unit in flight through registers
        group = max(g for g in range(1, max(1, min(staged, regs // (cpw * halves))) + 1) if fits(staged, g))
    elif wgmma:
        group = 4  # units computed at once: warp r of each warpgroup computes the group's unit r
    elif ilp:  # units whose weights are in registers, computed at once: every unit of the CTA when
        # the prefetch holds them all (H200, TP4, 4 units instead of 2 at S = 9 / 16 / 24 / 48:
        # 18.40 / 19.69 / 25.0 / 33.5 -> 17.98 / 19.15 / 24.05 / 32.5 us); else as many as leave the
        # next group's loads in flight (refilled as a group ends) beside both token halves' operands ...
        group = upc if upc <= prefetch else max(1, PREFETCH_LOADS // (cpw * halves))
        # ... their weight scales unpacked into LDS when the group's loads times the token halves
        # exceed that budget: in registers they spilled then (16 B with 4 units at S = 48); in LDS
        # at S = 1 the stage ended 0.3 us later (the store, sync and loads behind the rows' wait)
        lds_scales = group * cpw * halves > PREFETCH_LOADS
        if group > 1 and _group_spans_parts(units, ctx.stage_ctas, rows // ROWS_PER_UNIT, group):
            group = 1  # ... when every group's units share their K part (they share the token rows)
    # wgmma's rows: copied from the source's mailbox into the 128-byte-swizzled layout (whole
    # lines a load; the core matrices' order took 3-4 us at 48 rows, sectors a load), quantized
    # here into core matrices (H200, S = 2: swizzled there too 12.0 -> 12.4-12.9 us, not understood)
    swizzle = wgmma and not (inline or q_inline)
    if wgmma:  # whole 8-token groups (swizzled: 1024-byte aligned atoms)
        ctx.lds(stage.name, "x", "u32", token_groups * 8 * kp // 4, align=1024 if swizzle else 16)
    else:
        ctx.lds(stage.name, "x", "u32", tile * xstride)
    ctx.lds(stage.name, "xs", "float", tile * sstride)
    # a source that stores its rows as the swizzled LDS image (its image): one TMA bulk copy of
    # the K part's stretch where this build's rows are that image (else 16-byte loads from the
    # image's places)
    image_groups = 0
    if not (inline or q_inline) and mxfp8_quant.writes_image(src, ctx):
        image_groups = mxfp8_quant.image_groups(tokens)
    tma_rows = bool(image_groups) and swizzle and tile == tokens
    # a source that stores QX8 as tagged pairs (mla_norm_rope tagged): the rows poll their own
    # tags, two 16-byte loads a piece (no flag wait, no cp.async: a copy cannot check tags)
    tagged = src.kind == "mla_norm_rope" and not q_inline and ctx.stage_values(src.name)["tagged"]
    # ... stored tagged_copies times, this CTA polling one copy: its count and strides
    src_copies = ({k: ctx.stage_values(src.name)[k] for k in ("tagged_copies", "copy_pairs", "copy_code_pairs")}
                  if tagged else {"tagged_copies": 1})
    pending_polls = ctx.switch(stage.pending_polls, ("pending_polls",)) and tagged
    poll_sleep = ctx.integer(stage.poll_sleep, ("poll_sleep",), minimum=0) if tagged else 0
    if poll_sleep > 10000:
        ctx.fail(("poll_sleep",), f"{poll_sleep} ns between polls: at most 10000 (a wait, not a nap)",
                 "set poll_sleep to 0 (the target's pause) .. 10000 ns")
    if tagged and rows_async:
        ctx.fail(("rows_async",), f"stage {src.name!r} publishes tagged pairs, which the rows' polls check "
                 "(an asynchronous copy cannot)", "turn rows_async off for this build")
    if tma_rows:
        ctx.lds(stage.name, "rbar", "u64", 1)  # the rows' bulk copy's mbarrier
    part_waves = groups if wgmma else waves  # partial tiles a unit: one a warpgroup (wgmma), else one a wave
    # wgmma: every 16-column pass's tiles side by side, one barrier and one epilogue a group
    passes = -(-tile // 16) if wgmma else 1
    ctx.lds(stage.name, "part", "float", passes * group * part_waves * ROWS_PER_UNIT * part_row(t))
    if lds_scales:  # each warp's weight scales of a group (its chunks')
        ctx.lds(stage.name, "wsc", "float", waves * group * cpw * (chunk // MX_BLOCK))
    if bulk:
        ctx.lds_kernel(stage.name, "w", "u32", staged * unit_bytes // 4)  # unit i of the CTA at i * UNIT_BYTES
        ctx.lds_kernel(stage.name, "wbar", "u64", 1)  # the bulk copies' mbarrier
    elif lds_w:
        ctx.lds(stage.name, "w", "u32", staged * unit_bytes // 4)  # unit i of the CTA at i * UNIT_BYTES
        ctx.lds(stage.name, "wcodes", "u32", code_rows(staged) * (k // MX_BLOCK) // 4)  # their scale rows
        ctx.lds(stage.name, "wbar", "u64", 1)  # the bulk copies' mbarrier

    rope = {}
    if stage.epilogue == "partials":
        ctx.region(stage.out, ("out",), kind="pairs", min_count=parts * tokens * rows)
    else:
        if rows % head_dim or head_dim % ROWS_PER_UNIT or not 0 <= nope < head_dim or (head_dim - nope) % 2:
            ctx.fail(("head_dim",), f"rows {rows}, head_dim {head_dim}, nope {nope}: heads of whole 16-row units "
                     "with an even number of RoPE dims expected")
        if parts != 1:
            ctx.fail(("k_parts",), "the rope_bf16 epilogue needs whole rows (k_parts: 1)")
        ctx.abi_arg(stage.out, ("out",), dtype="bf16", shape=(tokens, rows // head_dim, head_dim), written=True)
        ctx.abi_arg(stage.cos_sin, ("cos_sin",), dtype="f32", shape=(None, head_dim - nope))
        ctx.abi_arg(stage.pos, ("pos",), dtype="i64", shape=(tokens,))
        rope = {"head_dim": head_dim, "nope": nope, "rope": head_dim - nope}
        ctx.lds(stage.name, "cs", "float", tokens * (head_dim - nope))  # every token's cos / sin row
    return {
        "rows": rows,
        "k": k,
        "k_parts": parts,
        "kp": kp,
        "nc": nc,
        "cpw": cpw,
        "prefetch": prefetch,
        "ilp": ilp,
        # when the staged units' bulk copies go out: "start" (bulk_weights: at the kernel's start,
        # into LDS of the kernel's lifetime), "stage" (lds_weights: at the stage's start), "" (none)
        "bulk": "start" if bulk else "stage" if lds_w else "",
        "staged": staged,
        "group": group,
        "lds_scales": lds_scales,  # a group's weight scales in LDS (else in registers)
        "wgmma": wgmma,
        "groups": groups,  # wgmma: warpgroups
        "wgmma_depth": depth,  # wgmma: a warp's chunks in flight
        "part_waves": part_waves,
        "passes": passes,
        "late_weights": late,
        # the stage whose run() the kernel precedes with this stage's prefetch_l2() (None: off)
        "l2_prefetch_at": l2_at,
        "token_groups": token_groups,
        "swizzle": swizzle,
        "image_groups": image_groups,  # the source's rows: its LDS image (0: row-major)
        "tma_rows": tma_rows,
        # bulk: units past the staged ones whose weights are in registers while a group computes
        "rest_prefetch": min(max(1, (PREFETCH_LOADS - group * cpw * halves) // cpw), upc - staged),
        "prologue": bulk,  # the kernel calls its prologue() before any stage: the bulk copies
        "tile": tile,
        "n_tiles": -(-tokens // tile),
        "xstride": xstride,
        # staging: 8-value items quantized here (16-byte bf16 loads), or 16-byte X8 pieces
        # (tagged: the codes' pieces with the rows')
        "row_batch": row_batch(tile * (kp // 16 + kp // 128) if tagged else tile * kp // (8 if inline else 16), ctx.threads),
        "sstride": sstride,
        "inline": inline,
        "q_inline": q_inline,
        # rows from the source's mailbox: their scale codes by cp.async (NVIDIA; AMD's device
        # library has no asynchronous global-to-LDS copy), not a second round of loads
        "async_codes": not (inline or q_inline or tagged) and t.vendor == "nvidia",
        "tagged": tagged,  # rows and codes from tagged pairs, polled (no flag wait)
        "pending_polls": pending_polls,  # ... each round only the pieces not yet tagged
        "poll_sleep": poll_sleep,  # ... and this many ns between rounds (0: pause())
        # ... from one of the source's copies of the pairs (CTA % copies), each copy_pairs pairs
        # of rows and copy_code_pairs of codes after the one before
        "src_copies": src_copies,
        "rows_async": rows_async and not (inline or q_inline or tma_rows),  # and the rows too (spec rows_async)
        "q_math": q_math,
        "norm_par": norm_par,
        "src": pub,
        "src_kind": src.kind,
        "src_fields": src,
        "src_parts": src_parts,
        "copies": copies,
        "flag_stride": flag_stride,
        "mx_fp8_max": mx_fp8_max(t),
        "rope": rope,
        "fields": stage,
    }
