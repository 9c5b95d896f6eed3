"""Stage kind ``gemv_fp8``: FP8 activations times a preshuffled FP8 weight with
per-row scales, 16 rows a task, bf16 results into a pairs mailbox.

Per (token t, row r) (contract A.5.3): ``tot = sum_k x8[t, k] * w[r, k]`` in
f32 (the MMA's order; waves' partials summed in wave order), then
``bf16((tot * x_scale[t]) * w_scale[r])``, stored as f32 bits with the tag.

The activations come from the ``rmsnorm_fp8`` stage named by ``x_from``:
through its mailbox when that stage runs in the build, or computed by every
GEMV CTA itself when the build leaves it out (few tokens: one hand-off less on
the critical path; the CTA running task t writes the residual of token t)."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from ..spec.models import Expr, Model as _Base, Name, PerTarget, StageBase, per_target
from .rmsnorm_fp8 import check_io, checked_norm_constants, residual_done

KIND = "gemv_fp8"
STAMPED_POINTS = ("done_point",)
ROWS_PER_TASK = 16  # one MMA tile of output rows
K_CHUNK = {"amd": 64, "nvidia": 32}  # k per 16-byte weight load of a lane
LAUNCH = "launch"  # l2_prefetch_at: before the kernel's wait for the previous launch, not before a stage
CHUNK_BYTES = 16 * 32  # one chunk of a 16-row group: 16 bytes a lane (wave 32; lds_prefetch is NVIDIA-only)
# 16-byte loads a thread keeps in flight while it stages token rows from the L2 (registers
# beside the weights'); the batch evens them out: 12 loads a thread go as two batches of 6
ROW_LOADS = 8
# floats a row of a wave's 16 x 16 partial tile takes in LDS (the kernel's PART_ROW, for the
# device libraries and both GEMV kinds), per vendor. AMD: odd, so that the epilogues' reads down
# a column are conflict-free. NVIDIA: 18, even, so that put_tile stores a lane's column pair as
# one 8-byte store: an 8-column half of a tile is 2 stores of 4 bank wavefronts (8 in all), where
# 17 took 4 four-byte stores of 4 (16: bank conflicts); the reads down a column stay conflict-free.
PART_ROW = {"amd": 17, "nvidia": 18}
X8_ROW_PAD_WORDS = 4  # LDS row padding: token rows land on different banks


def part_row(target) -> int:
    """The target's PART_ROW."""
    return PART_ROW[target.vendor]


def row_batch(pieces: int, threads: int) -> int:
    """Loads a thread issues at once to stage `pieces` 16-byte pieces (copy16_batched): as few
    round trips as ROW_LOADS allows, each batch as small as that count of trips allows."""
    trips = -(-pieces // threads)
    return -(-trips // -(-trips // ROW_LOADS))


class LongStep(_Base):
    """Indexer context parallelism: a step is long when some request's last row
    sees more than ``from_blocks`` blocks of ``block`` tokens."""

    seq_lens: Name = "seq_lens"
    q_len: Name = "q_len"
    from_blocks: Expr = "INDEX_CP_FROM_BLOCKS"
    block: Expr = "SPARSE_BLOCK"


class Model(StageBase):
    kind: Literal["gemv_fp8"]
    ready_point: Name | None = "x8_ready"  # timeline point: the token rows in LDS
    # timeline point: the inline norm's rows in LDS, before the rows-first pair's dots (inline only)
    normed_point: Name | None = None
    done_point: Name | None = "gemv_done"  # timeline point: the CTA's rows put
    staged_point: Name | None = None  # timeline point: the weights staged in LDS have landed (lds_prefetch)
    # timeline point: the CTA's first staged segment has landed (segment_waits: its own wait over)
    first_staged_point: Name | None = None
    piece_point: Name | None = None  # timeline point: the CTA's head piece put (stream-K)
    # timeline point: every wave's MMAs of the CTA's last segment done, before its epilogue (stream-K)
    mmas_point: Name | None = None
    tail_point: Name | None = None  # timeline point: the tail's lower piece arrived from the previous CTA (stream-K)
    weight: Name  # ABI fp8 [rows, K], preshuffled for the target (codegen.weights)
    weight_scale: Name  # ABI f32 [rows]
    rows: Expr  # output rows of the whole projection
    k: Name = "HIDDEN"
    x_from: Name  # the rmsnorm_fp8 stage whose x8 rows and scales this reads
    out: Name  # pairs region: row r of token t at pair t * rows + r
    token_tile: PerTarget = PerTarget(default=16)  # tokens per pass over LDS x8
    # the projection rows the tasks cover, as [first row, row count] ranges in task
    # order (default: all rows); each range a whole number of 16-row groups
    row_ranges: list[tuple[Expr, Expr]] | None = None
    long_step: LongStep | None = None  # run only in steps with a long request
    writes_residual: bool = True  # inline norm: the CTA of task t writes token t's residual (one stage only)
    # with the x_from stage off in a build: true = normalize here, false = read the rows an
    # earlier inline GEMV stage's residual writers publish (waits_on must name it)
    norm_inline: bool = True
    # stream-K per target (1 = on): the (row group, k chunk) units split evenly over the
    # CTAs, a row group shared by two CTAs summed through the `partials` pairs region
    stream_k: PerTarget = PerTarget(default=0)
    partials: Name | None = None
    # LDS prefetch per target (1 = on; stream-K, NVIDIA): a CTA's largest row-group segment
    # streams into registers, its other segments into LDS by asynchronous copies, all issued
    # before the norm (or the wait for its rows): the CTA's whole weight share is in flight
    # from the start instead of one segment at a time
    lds_prefetch: PerTarget = PerTarget(default=0)
    # when the weight stream starts, per target: 1 = right behind the norm's input loads (or
    # before the wait for the norm's rows), 0 = once those inputs / rows have arrived, so
    # that they do not queue behind the stream in the SM's memory pipeline (stream-K only)
    early_weights: PerTarget = PerTarget(default=1)
    # bulk copies per target (1 = on; with lds_prefetch): the staged segments travel as one
    # TMA bulk copy each, issued by one thread (no warp waits to issue 16-byte loads, no
    # per-SM limit of outstanding loads); the whole share goes to LDS when it fits
    bulk_copies: PerTarget = PerTarget(default=0)
    # per-segment waits per target (1 = on; with lds_prefetch): each staged segment is waited for
    # just before its MMAs (its own mbarrier with bulk copies, its own cp.async group else), so
    # that the CTA's first segment (the head piece the next CTA waits for) is summed while the
    # rest still lands; 0 = all of the CTA's staged weights at once (MiniMax S = 1: weights landed
    # 4.9 us, GEMV done 7.7, bench/NOTES.md MiniMax session 13)
    segment_waits: PerTarget = PerTarget(default=0)
    # rotated copies per target (1 = on; with bulk_copies): each staged segment as two bulk copies
    # on its mbarrier, the first from a chunk that depends on the CTA (an eighth of the segment
    # times (3 x CTA) mod 8) to its end, then its start, so that the CTAs' streams do not walk
    # their shares in step. The same bytes land in the same places, waited for as before: the same
    # sums (MiniMax S = 1 / 2: -0.1..-0.2 us by turns in two H100 calls, bench/NOTES.md session 51)
    rotate_copies: PerTarget = PerTarget(default=0)
    # stream-K (1 = on): the threads that finish the CTA's tail group read its lower piece (the
    # previous CTA's head piece) once they have put the iteration's results before it, not after
    # the tail's MMAs, so that the L2 round trip overlaps them; a read that finds an older tag is
    # waited for as before (MiniMax S = 1: head piece put 5.4 us, GEMV done 7.2, bench/NOTES.md
    # MiniMax session 21)
    tail_read_ahead: PerTarget = PerTarget(default=0)
    # rows first (1 = on; sm90 stream-K with an inline norm): the row range rows_first_range (one of
    # row_ranges) is left out of the stream-K units and computed first, on the stage's first
    # count / 2 CTAs, two rows each (rows p and p + 8 of a 16-row group: 64 contiguous bytes of
    # each 32-k chunk in the sm90 preshuffle), by CUDA-core dots against the norm's LDS rows, their
    # weights (2 K bytes) asked for before the CTA's share, so that those rows are done long
    # before the GEMV: the index q's rows (bench/NOTES.md MiniMax sessions 22-24: S = 1 at 4K
    # -0.4 us, at 64K and S = 2 slower; session 38, on later code: S = 1 -0.4 / -0.4 us at 4K /
    # 64K, S = 2 -0.3 / even, so the spec's up to 2 rows)
    rows_first: PerTarget = PerTarget(default=0)
    rows_first_range: tuple[Expr, Expr] | None = None
    # the CTA's stream-K segments' weights into L2 (1 = on; sm90: a TMA prefetch a segment, by
    # thread 0) before the kernel's wait for the previous launch (l2_prefetch_at: launch, the one
    # place this kind takes), for a launch without the cooperative attribute whose CTAs may be
    # resident before the previous launch's end: gemv_mxfp8's l2_prefetch. Not yet measured
    l2_prefetch: PerTarget = PerTarget(default=0)
    l2_prefetch_at: Name | None = None
    _tile = field_validator("token_tile", "stream_k", "lds_prefetch", "early_weights", "bulk_copies", "segment_waits",
                            "rotate_copies", "tail_read_ahead", "rows_first", "l2_prefetch", mode="before")(
        classmethod(lambda cls, v: per_target(v)))


def lower(stage: Model, ctx) -> dict:
    """Template values: chunking of K over the waves, token tiles, LDS use."""
    t = ctx.target
    rows = ctx.integer(stage.rows, ("rows",))
    k = ctx.symbol(stage.k, ("k",))
    tasks = ctx.task_count
    ranges = [(0, rows)] if stage.row_ranges is None else [
        (ctx.integer(a, ("row_ranges", i, 0), minimum=0), ctx.integer(n, ("row_ranges", i, 1)))
        for i, (a, n) in enumerate(stage.row_ranges)]
    for i, (first, count) in enumerate(ranges):
        if first % ROWS_PER_TASK or count % ROWS_PER_TASK or count <= 0 or first < 0 or first + count > rows:
            ctx.fail(("row_ranges", i), f"row range [{first}, {first + count}) is not whole 16-row groups inside 0..{rows}",
                     "start and size each range on a multiple of 16 rows")
    covered = sum(n for _, n in ranges)
    if tasks * ROWS_PER_TASK != covered:
        ctx.fail(("tasks",), f"{tasks} tasks x {ROWS_PER_TASK} rows != {covered} rows to compute",
                 f"set tasks to {covered // ROWS_PER_TASK}")
    chunk = K_CHUNK[t.vendor]
    waves = ctx.threads // t.wave_size
    if k % (chunk * waves):
        ctx.fail(("k",), f"K = {k} does not split into {waves} waves of {chunk}-k chunks",
                 f"use K a multiple of {chunk * waves}")
    ctx.abi_arg(stage.weight, ("weight",), dtype="fp8", shape=(rows, k))
    ctx.abi_arg(stage.weight_scale, ("weight_scale",), dtype="f32", shape=(rows,))
    ctx.region(stage.out, ("out",), kind="pairs", min_count=ctx.tokens * rows)
    src = ctx.stage_model(stage.x_from, ("x_from",), kind="rmsnorm_fp8")
    inline = not ctx.stage_active(stage.x_from) and stage.norm_inline
    if not ctx.stage_active(stage.x_from) and not stage.norm_inline and not stage.waits_on:
        ctx.fail(("norm_inline",), "with the norm stage off, this stage reads rows another stage publishes",
                 "list that stage (an inline GEMV whose residual writers publish x8) in waits_on")
    if stage.normed_point is not None and not inline:
        ctx.fail(("normed_point",), f"normed_point stamps the inline norm's rows, but this build's norm runs as "
                 f"stage {stage.x_from!r}", f"use {stage.x_from}.done_point for this build, or set normed_point "
                 "only for builds whose GEMV norms its tokens itself")
    if inline:  # this stage does the norm's work itself: its bindings, reported at the norm's lines
        here, ctx.loc = ctx.loc, ("stages", ctx.loaded.spec.stages.index(src))
        check_io(src, ctx, k)
        ctx.loc = here
    tokens = ctx.tokens
    tile = min(tokens, ctx.integer(stage.token_tile.for_target(t.name), ("token_tile",)))
    if inline and tile < tokens:
        ctx.fail(("token_tile",), f"an inline norm needs every token in one tile ({tile} < {tokens})",
                 "raise token_tile or let the rmsnorm_fp8 stage run for this build")
    mma_n = 16 if t.vendor == "amd" else 8  # token columns of one MMA
    stride_words = k // 4 + X8_ROW_PAD_WORDS
    first = _rows_first(stage, ctx, ranges, inline)
    if first:  # its rows are not among the stream-K units
        ranges = [r for r in ranges if r != first]
        tasks -= first[1] // ROWS_PER_TASK
        ctx.lds(stage.name, "pair_sums", "float", waves * 2 * tokens)  # rows_first: the row pair's per-wave sums
    ctx.lds(stage.name, "x8", "u32", tile * stride_words)
    ctx.lds(stage.name, "part", "float", waves * ROWS_PER_TASK * part_row(ctx.target))  # per-wave C tiles
    ctx.lds(stage.name, "xs", "float", max(tokens, 1))
    ctx.lds(stage.name, "red", "float", 64)  # the inline norm's reductions
    return {
        "rows": rows,
        "k": k,
        "inline": inline,
        "tile": tile,
        "n_tiles": -(-tokens // tile),
        "mma_tiles": -(-tile // mma_n),
        "chunk": chunk,
        "chunks_per_wave": k // chunk // waves,
        "x8_stride_words": stride_words,
        "row_batch": row_batch(tile * (k // 16), ctx.threads),
        "norm": checked_norm_constants(k, ctx, ("k",)),
        "rdone": residual_done(src, ctx) if inline else None,
        "writes_residual": stage.writes_residual,
        "rows_first": first,  # (first row, rows) computed first, or None
        **stream_k(stage, ctx, k // chunk, tasks, tokens, tile),
        "ranges": [(first // ROWS_PER_TASK, count // ROWS_PER_TASK) for first, count in ranges],
        "long_step": None if stage.long_step is None else {
            "seq_lens": stage.long_step.seq_lens, "q_len": stage.long_step.q_len,
            "from_blocks": ctx.integer(stage.long_step.from_blocks, ("long_step", "from_blocks")),
            "block": ctx.integer(stage.long_step.block, ("long_step", "block"))},
        "src": src,
        "fields": stage,
    }


def _rows_first(stage: Model, ctx, ranges: list, inline: bool) -> tuple[int, int] | None:
    """rows_first's row range (first row, rows), checked, or None when off."""
    t = ctx.target
    if not ctx.switch(stage.rows_first.for_target(t.name), ("rows_first",)):
        return None
    ctx.nvidia_only(("rows_first",), "row-pair reads of the sm90 preshuffle")
    if not ctx.switch(stage.stream_k.for_target(t.name), ("stream_k",)) or not inline:
        ctx.fail(("rows_first",), "rows_first takes rows out of a stream-K split whose CTAs normalize the tokens "
                 "themselves (their LDS rows, before any wait)",
                 "turn stream_k on and leave the norm stage out of this build, or rows_first off")
    if stage.rows_first_range is None:
        ctx.fail(("rows_first_range",), "rows_first needs the row range it computes first",
                 "give rows_first_range: [first row, rows], one of row_ranges")
    first = (ctx.integer(stage.rows_first_range[0], ("rows_first_range", 0), minimum=0),
             ctx.integer(stage.rows_first_range[1], ("rows_first_range", 1)))
    if first not in ranges or len(ranges) < 2:
        ctx.fail(("rows_first_range",), f"rows {list(first)} are not one of the row ranges {[list(r) for r in ranges]}, "
                 "beside at least one other", "give one of row_ranges")
    if first[1] // 2 > ctx.stage_ctas:
        ctx.fail(("rows_first_range",), f"{first[1]} rows take {first[1] // 2} CTAs, two rows each; the stage has "
                 f"{ctx.stage_ctas}", "give a shorter range")
    return first


def stream_k(stage: Model, ctx, nchunk: int, tasks: int, tokens: int, tile: int) -> dict:
    """Stream-K values: whether the build splits units evenly over the CTAs, and
    the checks that make it safe (one token tile; no row group over three CTAs:
    a middle piece would need a second hand-off)."""
    on = ctx.switch(stage.stream_k.for_target(ctx.target.name), ("stream_k",))
    prefetch = ctx.switch(stage.lds_prefetch.for_target(ctx.target.name), ("lds_prefetch",))
    if prefetch and not on:
        ctx.fail(("lds_prefetch",), "lds_prefetch stages the later row-group segments of a stream-K CTA",
                 "turn stream_k on for this target, or lds_prefetch off")
    if prefetch:
        ctx.nvidia_only(("lds_prefetch",), "asynchronous global-to-LDS copy")
    bulk = ctx.switch(stage.bulk_copies.for_target(ctx.target.name), ("bulk_copies",))
    if bulk and not prefetch:
        ctx.fail(("bulk_copies",), "bulk_copies is how lds_prefetch moves the staged segments",
                 "turn lds_prefetch on for this target, or bulk_copies off")
    segment_waits = ctx.switch(stage.segment_waits.for_target(ctx.target.name), ("segment_waits",))
    if segment_waits and not prefetch:
        ctx.fail(("segment_waits",), "segment_waits waits for the segments lds_prefetch stages",
                 "turn lds_prefetch on for this target, or segment_waits off")
    # A point whose stamp sits in code this build leaves out would stamp nothing, silently: refuse it
    for field, built, where, fix in (
            ("staged_point", prefetch, "the wait for the weights lds_prefetch stages",
             "turn lds_prefetch on for this target, or staged_point off"),
            ("first_staged_point", segment_waits, "the first of the segment waits",
             "use staged_point, or turn segment_waits on"),
            ("piece_point", on, "a stream-K CTA's head piece put", "turn stream_k on for this target, or piece_point off"),
            ("mmas_point", on, "every wave's MMAs of a stream-K CTA's last segment done",
             "turn stream_k on for this target, or mmas_point off"),
            ("tail_point", on, "a stream-K tail's lower piece arrived",
             "turn stream_k on for this target, or tail_point off")):
        if getattr(stage, field) is not None and not built:
            ctx.fail((field,), f"{field} stamps {where}, which this build leaves out", fix)
    rotate = ctx.switch(stage.rotate_copies.for_target(ctx.target.name), ("rotate_copies",))
    if rotate and not bulk:
        ctx.fail(("rotate_copies",), "rotate_copies splits the staged segments' bulk copies",
                 "turn bulk_copies on for this target, or rotate_copies off")
    read_ahead = ctx.switch(stage.tail_read_ahead.for_target(ctx.target.name), ("tail_read_ahead",))
    if read_ahead and not on:
        ctx.fail(("tail_read_ahead",), "tail_read_ahead reads a stream-K CTA's lower piece ahead",
                 "turn stream_k on for this target, or tail_read_ahead off")
    early = ctx.switch(stage.early_weights.for_target(ctx.target.name), ("early_weights",))
    if not early and not on:
        ctx.fail(("early_weights",), "a late weight stream is built for stream-K CTAs only",
                 "turn stream_k on for this target, or early_weights back to 1")
    l2 = ctx.switch(stage.l2_prefetch.for_target(ctx.target.name), ("l2_prefetch",))
    if l2:
        ctx.nvidia_only(("l2_prefetch",), "L2 prefetch")
        if not on:
            ctx.fail(("l2_prefetch",), "l2_prefetch prefetches a stream-K CTA's segments",
                     "turn stream_k on for this target, or l2_prefetch off")
        if stage.l2_prefetch_at != LAUNCH:
            ctx.fail(("l2_prefetch_at",), f"a {KIND} stage prefetches before the wait for the previous launch only, "
                     f"got {stage.l2_prefetch_at!r}", f"set l2_prefetch_at: {LAUNCH}")
    if not on:
        return {"split": False, "partials": None, "prefetch": False, "early_weights": True, "bulk": False,
                "all_staged": False, "segment_waits": False, "rotate_copies": False, "l2_prefetch_at": None}
    if stage.partials is None:
        ctx.fail(("partials",), "stream_k needs a pairs region for the partial tiles", "add 'partials: <region>'")
    ctx.region(stage.partials, ("partials",), kind="pairs", min_count=tasks * 16 * 16)
    if tile < tokens:
        ctx.fail(("stream_k",), f"stream_k needs every token in one tile ({tile} < {tokens})", "raise token_tile")
    ctas = ctx.stage_ctas
    units = tasks * nchunk
    staged = whole = segments = 0  # most chunks one CTA stages in LDS (lds_prefetch); most chunks, segments of one CTA
    for c in range(ctas):
        lo, hi = c * units // ctas, (c + 1) * units // ctas
        lengths = []
        for g in range(lo // nchunk, (hi - 1) // nchunk + 1):
            if g * nchunk < lo and (g + 1) * nchunk > hi:
                ctx.fail(("stream_k",), f"row group {g} would span three CTAs ({ctas} CTAs for {tasks} groups)",
                         "turn stream_k off for this target: it needs at least one row group's worth of units per CTA")
            lengths.append(min(hi, (g + 1) * nchunk) - max(lo, g * nchunk))
        if len(lengths) > 3:  # the template keeps three segments' weight scales in registers
            ctx.fail(("stream_k",), f"CTA {c} would take {len(lengths)} row-group segments (at most 3)",
                     "turn stream_k off for this target: fewer CTAs than a third of the row groups")
        staged = max(staged, sum(lengths) - max(lengths))  # the largest segment stays in registers
        whole = max(whole, sum(lengths))
        segments = max(segments, len(lengths))
    # bulk copies: everything in LDS if it fits beside the stage's other buffers and the mbarriers
    # (one, or one a segment with segment_waits)
    bars = segments if segment_waits else 1
    all_staged = bulk and whole * CHUNK_BYTES + 16 * ((bars + 1) // 2) <= ctx.lds_left(stage.name)
    if all_staged:
        staged = whole
    if prefetch:
        ctx.lds(stage.name, "wstage", "u32", staged * CHUNK_BYTES // 4)
    if bulk:
        ctx.lds(stage.name, "wbar", "u64", bars)  # the bulk copies' mbarrier(s)
    return {"split": True, "partials": stage.partials, "tasks": tasks, "ctas": ctas, "nchunk": nchunk,
            "prefetch": prefetch, "staged_chunks": staged, "early_weights": early,
            "bulk": bulk, "all_staged": all_staged, "segment_waits": segment_waits, "rotate_copies": rotate,
            "tail_read_ahead": read_ahead,
            "l2_prefetch_at": LAUNCH if l2 else None}
