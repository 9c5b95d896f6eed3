"""Stage kind ``index_scores``: MiniMax-M3's indexer block scores (contract A.9).

For each request (``q_len`` consecutive rows) whose last row's context spans
more than ``topk_blocks`` blocks, every block b in ``[init, n_blk - local)``
is scored for every row k of the request:
``score = max_{j in b, j < seq_k} dot(bf16(K_j), iq_k) * f32(sm_scale * log2 e)``
(``-inf`` where no key of the block is in the row's context), written to the
``iscore`` pair ``k * stride + b`` with the launch's tag. Shorter contexts keep
all their blocks (unscored); the pinned first / last blocks are never written.

The work list (request, block) is known only at run time (``seq_lens``): every
CTA of the stage computes it and takes items by its rank, counted from
``lead_cta`` (the CTAs that finish earlier work first): a round of the list to
every rank in turn, except that the last ``late_ctas`` ranks (CTAs that enter
late) sit out the first ``late_items`` rounds. A second such deal (``few_*``)
serves lists of at most ``few_items`` items a CTA, where a late CTA's lag
weighs more.
A row's index q is made by the scorers themselves from the qkv mailbox with
the head stage's (``iq_from``) math, so they never wait for its head task; a
block that may hold a key inserted by this launch is read only after every
token's index-K head task is done (its flag).

Index-head context parallelism (``index_heads`` 4, rank ``index_own``): a
request whose last row sees more than ``cp_from_blocks`` blocks is long: it
scores only this rank's blocks ``b = first_own + 4 i`` for all four index
heads, into pair ``k * stride + h * stride / 4 + b / 4``.

The dots (``mma_dots``):

- on the CUDA cores: each thread a quarter of a key, 32 FMAs a row; a CTA scores its
  items ``batch_items`` at a time, one CTA barrier a batch, the next batch's keys in
  registers meanwhile;
- on sm90's tensor cores, by warp groups: a CTA with n items gives each the fewest warps
  G (1, 2, 4, 8) that keep ``busy_waves`` of its warps busy (n * G >= busy_waves); each
  warp takes its 128 / G keys of an item as tiles of 16 (the rows of bf16 m16n8k16 MMAs,
  against 8 index-q rows at a time), its tiles streamed through its own cp.async ring
  (``tiles_ahead`` in flight); the G warps of an item meet at a named barrier for its
  maxima (G = 1: none). Keys enter exactly (their fp8 bits placed as bf16 times 2^-120),
  index q times 2^64, and the maxima are scaled back by 2^56, exactly.

The stage's start puts the requests, the rows' context lengths, the block-table
entries of the CTA's first items and every index q into LDS, so that no key load
waits for a block-table read and no item for its index q (made once per stage, not
once per request a CTA meets). On the H200 the tensor-core scorer is bound by its
instructions and their latency, not by the keys (bench/NOTES.md, sessions 5 and 6)"""

from __future__ import annotations

from typing import Literal

import numpy as np

from pydantic import field_validator

from ..spec.models import Expr, Name, PerTarget, StageBase, per_target

KIND = "index_scores"
STAMPED_POINTS = ("start_point", "done_point")
LOG2E = 1.4426950408889634
REQUEST_WORDS = 5  # the template's struct Request: count, first, step, heads, new_from
MAX_BATCH = 4  # batch_items: two batches' keys in registers, 8 a thread an item
IQ_PAD = 4  # index-q quarters 36 floats apart: 16-byte LDS reads, the four quarters on distinct banks
MAX_TILES_AHEAD = 7  # tiles_ahead: a warp's ring of at most 8 tiles (16 KB)
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
    # the last late_ctas ranks (from lead_cta: CTAs that enter the stage late, after their head
    # tasks) take late_items items fewer: the work list's first late_items rounds go to the other
    # ranks alone (0: every rank takes a round of the list in turn)
    late_ctas: PerTarget = PerTarget(default=0)
    late_items: PerTarget = PerTarget(default=0)
    # a second deal (lead, late CTAs, their items fewer) for work lists of at most few_items items
    # a CTA, known at run time (0: the one deal): a late CTA's lag weighs more against few items
    few_items: PerTarget = PerTarget(default=0)
    few_lead_cta: PerTarget = PerTarget(default=0)
    few_late_ctas: PerTarget = PerTarget(default=0)
    few_late_items: PerTarget = PerTarget(default=0)
    index_heads: Expr = "index_heads"  # index-q heads in the projection (1, or 4 with context parallelism)
    index_own: Expr = "index_own"  # this rank's index-q head
    cp_from_blocks: Expr = "INDEX_CP_FROM_BLOCKS"  # longer requests are scored head-parallel

    # the dots on the tensor cores by warp groups (sm90, 1) or on the CUDA cores (0)
    mma_dots: PerTarget = PerTarget(default=0)
    # CUDA-core dots: items scored between two CTA barriers; the next batch's keys load meanwhile
    batch_items: PerTarget = PerTarget(default=1)
    # tensor-core dots in f16 (1): keys by the hardware's e4m3 -> f16x2 conversion (one instruction
    # a pair, where the bf16 dots take three: a tile's 32 conversions were ~96 of a warp's ~140
    # instructions), index q as f16 times 2^up a row (up puts the row's largest |value| in [2^14,
    # 2^15): exact but for values 2^29 below it, which f16's subnormals round), 2^-up applied after
    # the max. 0: bf16, exact (S = 16 / 4K: a tile took ~0.65 us a warp, from L2 as from HBM,
    # bench/NOTES.md MiniMax session 29)
    f16_dots: PerTarget = PerTarget(default=0)
    # tensor-core dots: the first 8 index-q rows' B fragments of an item loaded into registers once
    # an item (16 a lane), not once a tile (1); 0: every tile reads them from LDS again. A tile's LDS
    # traffic a warp is its keys' 2 KB written by cp.async and read, plus these 2 KB: with 16 warps
    # ~96 KB a tile round, ~0.4 us of the SM's 128 bytes a clock (a tile took ~0.65 us a warp at
    # S = 16, from L2 as from HBM, bench/NOTES.md MiniMax session 29)
    iq_regs: PerTarget = PerTarget(default=0)
    # tensor-core dots: each lane's 64 bytes of a tile by 16-byte loads into registers, one tile
    # ahead (1), not by cp.async into an LDS ring that each lane reads back alone (0): the keys'
    # 4 KB a tile a warp off the LDS. Needs tiles_ahead 1 (16 registers a lane): deeper, ptxas counts
    # every tile's loads on one scoreboard and each tile waits for them all (2 / 3 ahead built and
    # measured slower, bench/NOTES.md MiniMax sessions 30-31)
    key_regs: PerTarget = PerTarget(default=0)
    # tensor-core dots: tiles of 16 keys in flight (cp.async) in each warp's ring while one is scored
    tiles_ahead: PerTarget = PerTarget(default=3)
    # tensor-core dots: a CTA of n items gives each the fewest warps G (1, 2, 4, 8) with
    # n * G >= busy_waves (above the CTA's warps: more warps an item, in rounds)
    busy_waves: PerTarget = PerTarget(default=16)
    # the CTA's first keys_prefetch_items items' keys into L2 (1 = on; NVIDIA: one TMA prefetch a
    # block), and the index q's gamma and cos / sin rows, issued by the CTA's last thread in stage
    # keys_prefetch_at (an earlier gemv_fp8 stage) where it waits: after its inline norm for its
    # weights, or (rows from a norm stage) before the wait for the rows. They come from HBM while
    # the GEMV runs, not after it (S = 1: the scores ended ~2.5 us after the GEMV's last row; S = 16:
    # the keys streamed only after the GEMV, bench/NOTES.md MiniMax sessions 17 and 19)
    keys_prefetch: PerTarget = PerTarget(default=0)
    keys_prefetch_at: Name | None = None
    keys_prefetch_items: Expr = 1  # keys_prefetch: the CTA's first n items (their blocks)
    # the stage's setup (each request's work, the rows' context lengths, the block-table entries of
    # the CTA's first items, in LDS that lives for the whole kernel) done in stage early_setup_at
    # (an earlier gemv_fp8 stage) where its CTAs wait, as keys_prefetch is (1), not at this stage's
    # start (0): two L2 round trips and two barriers off the scorer's path (S = 16: 1.3-1.5 us from
    # the stage's entry to its setup, bench/NOTES.md MiniMax session 21). CTAs outside that stage
    # still set up here. With keys_prefetch in the same stage, the prefetch takes the first items'
    # pages from this setup (no loads of its own, which would hold the setup's barriers) and goes
    # out once that stage's token rows are in (the weights mostly landed, the HBM about to idle
    # through the GEMV's MMAs), not before its wait for them.
    early_setup: PerTarget = PerTarget(default=0)
    early_setup_at: Name | None = None
    # tensor-core dots: make the index q before the warps ask for their first key tiles (0: after,
    # so that the tiles load meanwhile). At many rows the first tiles of every warp are most of the
    # launch's keys, and make_index_q's few loads queued behind them (S = 16 / 4K: 4.3 us from the
    # stage's setup to its index q, bench/NOTES.md MiniMax session 19)
    iq_first: PerTarget = PerTarget(default=0)
    # the index q as the head task wrote it to iq_out, polled as the tagged pairs it also puts
    # (the head stage's iq_tagged, which must match) (1), instead of made from the qkv mailbox by
    # every CTA (0: no wait for the head task). The head CTA loads its inputs while it waits for
    # the rows; a scorer starts its loads only at the stage's start (S = 16: ~3 us from there to
    # the index q, bench/NOTES.md MiniMax session 20). One index head
    iq_from_out: PerTarget = PerTarget(default=0)
    # tensor-core dots: whether an asked tile starts its warp's next item decided by the tile's
    # place in the unrolled tile loop (1: a constant, so only the item's last tile carries the next
    # item's lookup) instead of by the stream's run-time count (0: every unrolled tile carries it,
    # ~90 SASS instructions jumped over). Same tiles in the same order. Nsight Compute's samples of
    # S = 16 / 64K: 27 % of the scorer's warp samples wait for instructions (bench/NOTES.md
    # MiniMax session 34)
    static_item_starts: PerTarget = PerTarget(default=0)
    # tensor-core dots: the CTA's first items (as many as it keeps pages of) read as setup() found
    # them, a word each after their pages (1), not by a walk over the requests from a cursor, one
    # LDS read a step (0; Nsight Compute, S = 16 / 4K: the walks were ~16 % of the scorer's warp
    # samples, bench/NOTES.md MiniMax session 34). The same items
    item_table: PerTarget = PerTarget(default=0)
    # make_index_q makes only the rows of the requests that the CTA's items score (1; setup() marks
    # them), not every request's (0): the CTA then polls only those tokens' index q, not the last
    # head task of every token, and its groups share fewer jobs (S = 16 / 4K: ~4 items a CTA, 16
    # jobs on 8 groups, two polls in turn a group; Nsight Compute: make_index_q 20 % of the
    # scorer's warp samples, bench/NOTES.md MiniMax session 34). The same scores
    iq_own_requests: PerTarget = PerTarget(default=0)

    _per_target = field_validator("lead_cta", "late_ctas", "late_items", "few_items", "few_lead_cta", "few_late_ctas",
                                  "few_late_items", "mma_dots", "f16_dots", "iq_regs", "key_regs", "batch_items",
                                  "tiles_ahead",
                                  "busy_waves", "keys_prefetch", "early_setup", "iq_first", "iq_from_out",
                                  "static_item_starts", "item_table", "iq_own_requests", mode="before")(
        classmethod(lambda cls, v: per_target(v)))
    # analysis stamps (timeline builds; off in the spec): the phases of each CTA's item
    # `stamped_item` (its j-th; a CTA with fewer items stamps none; tensor-core dots: warp 0's
    # `stamped_item`-th)
    stamped_item: Expr = 0
    setup_point: Name | None = None  # timeline point: the CTA's requests, lengths and first pages in LDS (every CTA)
    groups_point: Name | None = None  # timeline point: thread 0 enters its warp groups' loop (before the first ask)
    iq_start_point: Name | None = None  # timeline point: thread 0 starts make_index_q (its first poll or load follows)
    iq_point: Name | None = None  # timeline point: thread 0's index q rows made (its warp's jobs of make_index_q)
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


def _earlier_gemv(stage: Model, ctx, knob: str, every_cta: bool = False) -> str:
    """The stage named by ``<knob>_at`` for knob keys_prefetch / early_setup: an earlier
    gemv_fp8 stage of the build (gemv_fp8.j2 calls prefetch_first_keys / setup where its CTAs
    wait: for their weights after an inline norm, else for their token rows). ``every_cta``: the
    scorer takes that stage's CTAs as having done the work (the setup), so each of them must
    reach the wait."""
    names = [s.name for s in ctx.loaded.spec.stages]
    at = getattr(stage, f"{knob}_at")
    gemv = next((s for s in ctx.loaded.spec.stages if s.name == at), None)
    ok = (gemv is not None and gemv.kind == "gemv_fp8" and names.index(at) < names.index(stage.name)
          and ctx.stage_active(at))
    if not ok:
        ctx.fail((f"{knob}_at",), f"{knob} needs an earlier gemv_fp8 stage of this build, got {at!r}",
                 f"name it, or turn {knob} off for this build")
    gemv = ctx.stage_values(at)  # its lowering's: whether it splits stream-K, its long-step condition
    if every_cta and (gemv["long_step"] is not None or not gemv["split"]):
        ctx.fail((f"{knob}_at",), f"stage {at!r} may return before its wait on some of its CTAs (a long step's "
                 f"condition, or more CTAs than tasks without stream-K): the scorer would take their {knob} as done",
                 f"name a stream-K gemv_fp8 stage without long_step, or turn {knob} off for this target")
    return at


def _deal(stage: Model, ctx, prefix: str) -> tuple[int, int, int]:
    """A deal of the work list (``prefix`` "" or "few_"): its lead CTA, late CTAs and their
    items fewer (none without late CTAs)."""
    t = ctx.target.name
    lead = ctx.integer(getattr(stage, f"{prefix}lead_cta").for_target(t), (f"{prefix}lead_cta",), minimum=0)
    late_ctas = ctx.integer(getattr(stage, f"{prefix}late_ctas").for_target(t), (f"{prefix}late_ctas",), minimum=0)
    late_items = ctx.integer(getattr(stage, f"{prefix}late_items").for_target(t), (f"{prefix}late_items",), minimum=0)
    if late_ctas >= ctx.stage_ctas:
        ctx.fail((f"{prefix}late_ctas",), f"{late_ctas} late CTAs of the stage's {ctx.stage_ctas}: none would take "
                 "the early rounds", f"give {prefix}late_ctas 0 .. {ctx.stage_ctas - 1}")
    return lead, late_ctas, late_items if late_ctas else 0  # no late rank: the plain rounds


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
    mma = ctx.switch(stage.mma_dots.for_target(ctx.target.name), ("mma_dots",))
    waves = ctx.threads // ctx.target.wave_size
    batch = ctx.integer(stage.batch_items.for_target(ctx.target.name), ("batch_items",), minimum=1)
    if mma and batch != 1:
        ctx.fail(("batch_items",), f"the tensor-core dots take items by warp groups, not in batches of {batch}",
                 "give batch_items 1 where mma_dots is on (it is the CUDA-core dots' knob)")
    if batch > MAX_BATCH:
        ctx.fail(("batch_items",), f"batches of {batch} keep {16 * batch} key registers a thread, "
                 f"more than the {16 * MAX_BATCH} allowed", f"give batch_items at most {MAX_BATCH}")
    ahead = ctx.integer(stage.tiles_ahead.for_target(ctx.target.name), ("tiles_ahead",), minimum=1)
    busy = ctx.integer(stage.busy_waves.for_target(ctx.target.name), ("busy_waves",), minimum=1)
    if mma:
        ctx.nvidia_only(("mma_dots",), "bf16 m16n8k16 MMA")
        tiles = block // MMA_TILE_KEYS
        if head_dim != 128 or block % MMA_TILE_KEYS or tiles != 8 or waves % tiles:  # the template's static_assert
            ctx.fail(("mma_dots",), f"the tensor-core dots take 128-dim keys in blocks of 8 tiles of {MMA_TILE_KEYS} "
                     f"over a multiple of 8 warps (here {head_dim} dims, {block} keys a block, {waves} warps)",
                     "give mma_dots 0 for this build")
        if ahead > MAX_TILES_AHEAD:
            ctx.fail(("tiles_ahead",), f"{ahead} tiles ahead: at most {MAX_TILES_AHEAD}",
                     f"give tiles_ahead 1 .. {MAX_TILES_AHEAD}")
        most = waves * (block // MMA_TILE_KEYS)  # past it, every item takes all its tiles' warps
        if busy > most:
            ctx.fail(("busy_waves",), f"{busy} busy waves: at most {most} ({waves} waves, {block // MMA_TILE_KEYS} an item)",
                     f"give busy_waves 1 .. {most}")
        # index q as bf16 pairs, rows padded, 8 rows more: a B fragment may read past the last request's
        ctx.lds(stage.name, "iq", "u32", (rows + 8) * (head_dim // 2 + MMA_IQ_PAD))
        ctx.lds(stage.name, "best", "float", 2 * waves * rows)  # each warp's maxima of its item, two items
    else:
        ctx.lds(stage.name, "iq", "float", rows * quarters * (head_dim // quarters + IQ_PAD))  # index q, quarters padded
        ctx.lds(stage.name, "best", "float", 2 * batch * rows * waves)  # per-wave maxima, two batches

    def tensor_core_knob(field: str, value, why: str):
        """A knob of the tensor-core dots (``value``, already read), refused on the CUDA-core dots."""
        if value and not mma:
            ctx.fail((field,), f"{field} {why}", f"give {field} 0 where mma_dots is off")
        return value

    def tensor_core_switch(field: str, why: str) -> bool:
        return tensor_core_knob(field, ctx.switch(getattr(stage, field).for_target(ctx.target.name), (field,)), why)

    f16 = tensor_core_switch("f16_dots", "picks the tensor-core dots' input type; the CUDA-core dots take f32")
    iq_regs = tensor_core_switch("iq_regs", "holds the tensor-core dots' B fragments; the CUDA-core dots read the "
                                 "index q from LDS a key at a time")
    key_regs = tensor_core_switch("key_regs", "replaces the tensor-core dots' LDS ring; the CUDA-core dots load "
                                  "their keys into registers already")
    if key_regs and ahead != 1:
        ctx.fail(("key_regs",), f"key_regs holds one tile ahead in registers (16 a lane), not {ahead}",
                 "give tiles_ahead 1 with key_regs")
    iq_first = tensor_core_switch("iq_first", "orders the tensor-core dots' start; the CUDA-core dots load their "
                                  "first batch's keys into registers before the index q")
    static_items = tensor_core_switch("static_item_starts", "shapes the tensor-core dots' unrolled tile loop; the "
                                      "CUDA-core dots have none")
    iq_from_out = ctx.switch(stage.iq_from_out.for_target(ctx.target.name), ("iq_from_out",))
    if iq_from_out and heads != 1:
        ctx.fail(("iq_from_out",), f"the head tasks write only the own index-q head to iq_out, not all {heads}",
                 "give iq_from_out 'index_heads == 1' (or 0)")
    if iq_from_out and head_dim // 32 % 4:
        ctx.fail(("iq_from_out",), f"iq_from_out reads 4 values a lane at a time ({head_dim // 32} a lane here)",
                 "give iq_from_out 0 for this head size")
    # the head stage puts the index q as tagged pairs exactly where this stage polls them
    iq_tagged = ctx.stage_active(src.name) and ctx.stage_values(src.name)["iq_tagged"]
    if iq_from_out and not iq_tagged:
        ctx.fail(("iq_from_out",), f"iq_from_out polls the index q that stage {src.name} puts as tagged pairs, "
                 f"and {src.name}.iq_tagged is off in this build", f"give {src.name}.iq_tagged iq_from_out's value")
    if iq_tagged and not iq_from_out:
        ctx.fail(("iq_from_out",), f"stage {src.name} puts the index q as tagged pairs for this stage "
                 f"({src.name}.iq_tagged), which makes its own (iq_from_out off)",
                 f"give {src.name}.iq_tagged iq_from_out's value")
    lead, late_ctas, late_items = _deal(stage, ctx, "")
    few_items = ctx.integer(stage.few_items.for_target(ctx.target.name), ("few_items",), minimum=0)
    few_lead, few_late_ctas, few_late_items = _deal(stage, ctx, "few_") if few_items else (0, 0, 0)
    keys_at = None
    if ctx.switch(stage.keys_prefetch.for_target(ctx.target.name), ("keys_prefetch",)):
        ctx.nvidia_only(("keys_prefetch",), "L2 prefetch")
        keys_at = _earlier_gemv(stage, ctx, "keys_prefetch")
    setup_at = None
    if ctx.switch(stage.early_setup.for_target(ctx.target.name), ("early_setup",)):
        setup_at = _earlier_gemv(stage, ctx, "early_setup", every_cta=True)
    # both in one stage: the prefetch takes the setup's pages from LDS (no loads of its own, whose
    # chain would hold the setup's barriers) and goes out once that stage's token rows are in
    from_setup = keys_at is not None and setup_at == keys_at
    items = ctx.integer(stage.keys_prefetch_items, ("keys_prefetch_items",), minimum=1)
    if from_setup and items > ctx.threads:
        ctx.fail(("keys_prefetch_items",), f"with early_setup in the same stage the prefetch takes the setup's pages "
                 f"of the CTA's first {ctx.threads} items (one a thread), not {items}", f"at most {ctx.threads}")
    setup_lds = ctx.lds_kernel if setup_at else ctx.lds  # early: the earlier stage's LDS must not clobber it
    setup_lds(stage.name, "reqs", "u32", REQUEST_WORDS * ctx.tokens)  # each request's work (the template's Request)
    setup_lds(stage.name, "seq", "u32", ctx.tokens)  # each row's context length
    item_table = tensor_core_switch("item_table", "serves the tensor-core dots' streams; the CUDA-core dots walk "
                                    "their batches' items in order")
    # the block-table entries of a CTA's first items (item_table: then the items themselves)
    setup_lds(stage.name, "pages", "u32", ctx.threads * (2 if item_table else 1))
    own_requests = ctx.switch(stage.iq_own_requests.for_target(ctx.target.name), ("iq_own_requests",))
    if own_requests:
        setup_lds(stage.name, "want", "u32", ctx.tokens)  # [request]: nonzero if the CTA's items score it
    if mma and not key_regs:  # each warp's ring of tiles_ahead + 1 tiles (2 KB each)
        ring_bytes = waves * (ahead + 1) * MMA_TILE_KEYS * head_dim
        if ring_bytes > ctx.lds_left(stage.name):
            ctx.fail(("tiles_ahead",), f"{waves} rings of {ahead + 1} tiles ({ring_bytes} bytes) do not fit the "
                     f"{ctx.lds_left(stage.name)} bytes of LDS left", "give tiles_ahead fewer")
        ctx.lds(stage.name, "ring", "u32", ring_bytes // 4)
    return {
        "topk_blocks": ev(stage.topk_blocks, ("topk_blocks",)),
        "init_blocks": ev(stage.init_blocks, ("init_blocks",)),
        "local_blocks": ev(stage.local_blocks, ("local_blocks",)),
        "scale": score_scale(ev(stage.sm_scale, ("sm_scale",))),
        "block": block,
        "stride": ev(stage.stride, ("stride",)),
        "max_tokens": ev(stage.max_tokens, ("max_tokens",)),
        "lead": lead,
        "late_ctas": late_ctas,
        "late_items": late_items,
        "few_items": few_items,  # 0: no few-items deal
        "few_lead": few_lead,
        "few_late_ctas": few_late_ctas,
        "few_late_items": few_late_items,
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
        "f16": f16,  # the tensor-core dots in f16 (a scale a row), not bf16
        "iq_regs": iq_regs,  # block 0's B fragments in registers for an item
        "key_regs": key_regs,  # the keys by loads into registers, no LDS ring
        "ring": ahead + 1,
        "iq_first": iq_first,
        "iq_from_out": iq_from_out,
        "static_items": static_items,  # ask_next_tile's item start known per unrolled tile
        "item_table": item_table,  # the CTA's first items from setup()'s table
        "own_requests": own_requests,  # make_index_q: only the requests of the CTA's items
        "busy": busy,
        "mma_iq_pad": MMA_IQ_PAD,
        "tile_keys": MMA_TILE_KEYS,
        "key_down_log2": MMA_KEY_DOWN_LOG2,
        "iq_up_log2": MMA_IQ_UP_LOG2,
        "iq_up": 2.0 ** MMA_IQ_UP_LOG2,
        "dot_unscale": 2.0 ** (MMA_KEY_DOWN_LOG2 - MMA_IQ_UP_LOG2),  # the maxima scaled back, exactly
        "iq_pad": IQ_PAD,
        "request_words": REQUEST_WORDS,
        "stamped_item": ctx.integer(stage.stamped_item, ("stamped_item",), minimum=0),
        "keys_prefetch_at": keys_at,  # the gemv_fp8 stage that calls prefetch_first_keys() (None: off)
        "early_setup_at": setup_at,  # the gemv_fp8 stage that calls setup() (None: this stage's start)
        "keys_prefetch_items": items,
        "keys_from_setup": from_setup,  # prefetch_set_up_keys(), after the rows, not prefetch_first_keys()
        "done": src.done,
        "src": src,
        "start_point": stage.start_point,  # checked by the lowering for every stage
        "done_point": stage.done_point,
        "fields": stage,
    }

