"""MiniMax-M3 pre_attn (input norm + FP8 GEMV) on the GPU against the PyTorch
reference (contract A.5.1 - A.5.3).

Exact: h_out, the FP8 rows and per-token scales in the mailbox, every mailbox
tag. Within tolerance: the GEMV (MMA order), compared given the kernel's own
x8 and scales (1 bf16 ulp on >= 99.9 % of values, 2 ulp on all). Repeats: two
launches in a row and 100 CUDA-graph replays give identical values, with the
epoch advancing on the device."""

from __future__ import annotations

import pytest
import torch

import codegen
from codegen.fp import bf16_rn
from codegen.reference import minimax_m3 as ref
from tests.graphs import assert_slots_at, capture
from tests.launch_guard import launch
from tests.minimax_case import (CUDA_CORES, POISON_BF16, context_case, expected_tag, launch_args, make_inputs, read_mailbox,
                                reference_heads, reference_scores)

pytestmark = pytest.mark.gpu

TOKENS = (1, 2, 3, 4, 8, 15, 16)  # 15: the GEMV keeps a segment in registers, as at 16 (test_lower)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))


IQ_ROWS = slice(2304, 2304 + 128)  # the own index-q head's rows (IQ_OFF, one index head)

# the GEMV's builds besides the spec's: each must write the same qkv bits (the same sums in the
# same order), the staged weights only waited for differently; iq-in-stream-k the same bits outside
# the index q's rows (the spec's sum those on the CUDA cores up to 2 rows: rows_first)
GEMV_TUNES = {"spec": None,
              "segment-waits": {"qkv.segment_waits": 1},  # each staged segment waited for before its MMAs
              # the staged segments' bulk copies in order (the spec's sm90 rotates them up to 2 rows)
              "unrotated": {"qkv.rotate_copies": 0},
              "bulk-copies": {"qkv.bulk_copies": 1},  # every staged segment by TMA bulk copies, at every S
              "tail-in-turn": {"qkv.tail_read_ahead": 0},  # the tail's lower piece read in its turn (the spec's sm90: ahead)
              # the last CTA out advances the epoch (the spec's: the CTAs finished over all launches / BLOCKS)
              "epoch-last-out": {"mailbox.advance": "last_out"},
              # each CTA's own epoch in a scratch slot, CTA 0's copied into the counter
              "epoch-slots": {"mailbox.advance": "slots"},
              "iq-in-stream-k": {"qkv.rows_first": 0},  # the index q's rows in the stream-K units at every S
              # the CTA's segments into L2 before the wait for the previous launch (l2_prefetch_at launch)
              "early-prefetch": {"qkv.l2_prefetch": 1, "qkv.l2_prefetch_at": "launch"}}


@pytest.mark.parametrize("tune_id", GEMV_TUNES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_pre_attn_norm_gemv(tokens, tune_id):
    tune = GEMV_TUNES[tune_id]
    if tune and not torch.version.cuda:
        pytest.skip("the GEMV's LDS staging knobs are sm90's")
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, tune=tune)
    target = kernel.target
    inp = make_inputs(tokens, target.name, seed=100 + tokens)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    launch(kernel, args)

    want = ref.norm_quant(inp["ar"], inp["res"], inp["g_in"], 1e-6, target)
    got = read_mailbox(kernel, ws["scratch"], tokens)
    # exact: residual, FP8 rows and scales, every tag of this launch
    assert torch.equal(args["h_out"].cpu().view(torch.int16), want["h_out"].view(torch.int16))
    assert torch.equal(got["x_scale"], want["x_scale"])
    assert torch.equal(got["x8"].view(torch.uint8), want["x8"].view(torch.uint8))
    assert (got["x8s_tag"] == expected_tag(0)).all()
    assert (got["qkv_tag"] == expected_tag(0)).all(), "some qkv pairs were not written by this launch"
    assert ws["step"].cpu().tolist() == kernel.ir.advanced([0, 0]), "the kernel advanced its counter once"
    assert kernel.ir.epoch(ws["step"].cpu()) == 1

    # GEMV within tolerance, given the kernel's own x8 and scales
    qkv_ref = ref.qkv_gemv(got["x8"], got["x_scale"], inp["w"], inp["s_qkv"])
    ulps = ref.bf16_ulp_diff(got["qkv"], qkv_ref)
    assert ulps.max().item() <= 2, f"max {ulps.max().item()} bf16 ulp"
    assert (ulps <= 1).float().mean().item() >= 0.999
    assert torch.equal(got["qkv"], bf16_rn(got["qkv"])), "qkv values are bf16-rounded"
    if tune:  # the spec's build on the same inputs: the same qkv bits
        spec = codegen.load("minimax_m3/pre_attn", tokens=tokens)
        spec_ws = spec.workspace("cuda")
        launch(spec, launch_args(inp, spec_ws))
        same = torch.ones(got["qkv"].shape[1], dtype=torch.bool)
        if tune_id == "iq-in-stream-k" and tokens <= 2:
            same[IQ_ROWS] = False
        spec_qkv = read_mailbox(spec, spec_ws["scratch"], tokens)["qkv"]
        assert torch.equal(spec_qkv[:, same].view(torch.int16), got["qkv"][:, same].view(torch.int16))

    # head tasks: exact given the kernel's own qkv (sm90's rsq is the ieee one)
    heads = reference_heads(inp, got["qkv"], args)
    for name in ("q_out", "iq_out", "k_cache", "v_cache", "k_scale", "v_scale", "index_cache"):
        assert same_bytes(args[name], heads[name]), f"{name} differs"

    # a second launch: same values, the next epoch's tags
    first = got
    args["h_out"].view(torch.int16).fill_(POISON_BF16)
    launch(kernel, args)
    again = read_mailbox(kernel, ws["scratch"], tokens)
    assert torch.equal(args["h_out"].cpu().view(torch.int16), want["h_out"].view(torch.int16))
    assert torch.equal(again["qkv"], first["qkv"]) and torch.equal(again["x8"].view(torch.uint8), first["x8"].view(torch.uint8))
    assert (again["qkv_tag"] == expected_tag(1)).all()


@pytest.mark.parametrize("pdl", (True, False), ids=("pdl", "no-pdl"))
@pytest.mark.parametrize("advance", ("last_out", "count", "slots", "count, early prefetch"))
@pytest.mark.parametrize("tokens", (1, 16))
def test_pre_attn_graph_replays(tokens, advance, pdl):
    """25 replays of a graph of 4 launches in a row, nothing cleared in between: identical
    outputs, and the epoch advanced once per launch on the device (every way of keeping the
    counter: mailbox.advance: the last CTA out, the count added at each CTA's end, or each
    CTA's own slot, every slot at the counter's epoch after them;
    launches overlapping their neighbours by programmatic dependent launch, the default, or
    one after the other; and the GEMV's weights prefetched before the
    wait for the previous launch, launched without the cooperative attribute as that is meant)."""
    early = advance == "count, early prefetch"
    tune = {"last_out": {"mailbox.advance": "last_out"}, "count": {"mailbox.advance": "count"},
            "slots": {"mailbox.advance": "slots"},
            "count, early prefetch": {"mailbox.advance": "count", "qkv.l2_prefetch": 1,
                                      "qkv.l2_prefetch_at": "launch"}}[advance]
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, tune=tune, pdl=pdl, cooperative=not early)
    inp = make_inputs(tokens, kernel.target.name, seed=7 + tokens)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    launch(kernel, args)  # compile and warm up outside the capture
    single = read_mailbox(kernel, ws["scratch"], tokens)
    h_single = args["h_out"].clone()

    graph = capture(lambda: kernel(**args), times=4)
    torch.cuda.synchronize()
    step_before = kernel.ir.epoch(ws["step"].cpu())
    want = ws["step"].cpu().tolist()
    for _ in range(25):
        graph.replay()
        want = kernel.ir.advanced(want, 4)
    torch.cuda.synchronize()
    assert kernel.ir.epoch(ws["step"].cpu()) == step_before + 100 and ws["step"].cpu().tolist() == want
    assert_slots_at(kernel.ir, ws["scratch"], step_before + 100)
    got = read_mailbox(kernel, ws["scratch"], tokens)
    assert torch.equal(got["qkv"], single["qkv"])
    assert torch.equal(args["h_out"], h_single)
    assert (got["qkv_tag"] == expected_tag(step_before + 99)).all()


@pytest.mark.parametrize("tokens", (1, 16))
def test_pre_attn_bound_launch(tokens):
    """kernel.bind(**args) (every check once): its launches write what a checked launch writes
    (the outputs poisoned again in between), each advances the epoch once, and one captured
    into a graph replays the same."""
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens)
    inp = make_inputs(tokens, kernel.target.name, seed=31 + tokens)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    launch(kernel, args)
    checked = read_mailbox(kernel, ws["scratch"], tokens)
    outputs = {name: args[name].clone() for name in ("h_out", "q_out", "iq_out", "iscore")}
    bound = kernel.bind(**args)
    for step in (1, 2):
        for name in ("h_out", "q_out", "iq_out"):
            args[name].view(torch.int16).fill_(POISON_BF16)
        args["iscore"].zero_()  # as the checked launch found it (its unscored bytes stay 0)
        launch(kernel, args, bound=bound)
        got = read_mailbox(kernel, ws["scratch"], tokens)
        assert all(same_bytes(args[name], want) for name, want in outputs.items())
        assert torch.equal(got["qkv"], checked["qkv"]) and (got["qkv_tag"] == expected_tag(step)).all()
        assert kernel.ir.epoch(ws["step"].cpu()) == step + 1
    graph = capture(bound, times=2)
    graph.replay()
    torch.cuda.synchronize()
    assert kernel.ir.epoch(ws["step"].cpu()) == 5
    assert torch.equal(read_mailbox(kernel, ws["scratch"], tokens)["qkv"], checked["qkv"])


@pytest.mark.parametrize("tokens", (2, 16))
def test_timeline(tokens):
    """timeline=True: the same outputs as timeline=False; every CTA stamps its
    start, and each point a CTA reaches comes after its start, in the
    contract's order where a CTA passes several (A.10)."""
    outs = {}
    for timeline in (False, True):
        kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, timeline=timeline)
        inp = make_inputs(tokens, kernel.target.name, seed=3)
        case = context_case(tokens, 1, [70000, 3000], seed=5)
        ws = kernel.workspace("cuda")
        args = launch_args(inp, ws)
        args.update(seq_lens=case["seq_lens"].cuda(), block_table=case["block_table"].cuda(),
                    bt_width=case["bt_cols"], index_cache=case["index_cache_bytes"].cuda().view(inp["fp8"]))
        launch(kernel, args)
        outs[timeline] = {k: args[k].cpu() for k in ("h_out", "q_out", "iq_out", "k_cache", "index_cache", "iscore")}
        outs[timeline]["qkv"] = read_mailbox(kernel, ws["scratch"], tokens)["qkv"]
        if timeline:
            tl = ws["tl"].cpu()
            pts = kernel.ir.timeline_points
            start = tl[:, pts.index("start")]
            assert (start > 0).all()
            for p in pts[1:]:
                col = tl[:, pts.index(p)]
                assert (col[col > 0] >= start[col > 0]).all(), p
            gemv, scores = tl[:, pts.index("gemv_done")], tl[:, pts.index("scores_done")]
            both = (gemv > 0) & (scores > 0)
            assert both.any() and (scores[both] >= gemv[both]).all()
            assert (tl[:, pts.index("spare")] == 0).all()
    for k in outs[False]:
        assert same_bytes(outs[False][k], outs[True][k]), f"{k} differs with the timeline on"


def test_timeline_last_got_point():
    """heads.last_got_point (S = 16): each head CTA's slot holds the latest of its tokens' stamps, so
    it is at or after thread 0's got_point (token 0's) and before the CTA enters the scorer; no
    other CTA stamps it."""
    kernel = codegen.load("minimax_m3/pre_attn", tokens=16, timeline=True, tune={"heads.last_got_point": "spare"})
    inp = make_inputs(16, kernel.target.name, seed=3)
    ws = kernel.workspace("cuda")
    launch(kernel, launch_args(inp, ws))
    tl, pts = ws["tl"].cpu(), kernel.ir.timeline_points
    heads = next(s for s in kernel.ir.stages if s.name == "heads")
    mine = torch.zeros(tl.shape[0], dtype=torch.bool)
    mine[heads.first:heads.first + heads.ctas] = True
    last, got, entered = (tl[:, pts.index(p)] for p in ("spare", "head_got_qkv", "pre_attn_done"))
    assert (last[mine] > 0).all() and (last[~mine] == 0).all()
    assert (last[mine] >= got[mine]).all() and (last[mine] <= entered[mine]).all()


@pytest.mark.parametrize("eps", (1e-5,))
def test_eps_build_parameter(eps):
    """The eps build parameter reaches the input norm and the head norms."""
    kernel = codegen.load("minimax_m3/pre_attn", tokens=3, eps=eps)
    inp = make_inputs(3, kernel.target.name, seed=11)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    launch(kernel, args)
    want = ref.norm_quant(inp["ar"], inp["res"], inp["g_in"], eps, kernel.target)
    got = read_mailbox(kernel, ws["scratch"], 3)
    assert torch.equal(got["x_scale"], want["x_scale"])
    heads = reference_heads(inp, got["qkv"], args, eps=eps)
    for name in ("q_out", "k_cache", "index_cache"):
        assert same_bytes(args[name], heads[name]), f"{name} differs"


def test_argument_errors_on_gpu():
    kernel = codegen.load("minimax_m3/pre_attn", tokens=2)
    inp = make_inputs(2, kernel.target.name, seed=1)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    bad = dict(args, ar=args["ar"].t().contiguous().t())  # same values, column-major
    with pytest.raises(codegen.launch.ArgumentError, match="'ar'.*contiguous"):
        kernel(**bad)
    misaligned = torch.empty(2 * ref.HIDDEN + 1, dtype=torch.bfloat16, device="cuda")[1:].view(2, ref.HIDDEN)
    with pytest.raises(codegen.launch.ArgumentError, match="'res'.*16-byte aligned"):
        kernel(**dict(args, res=misaligned))


@pytest.mark.parametrize("tokens", (1, 3, 16))
@pytest.mark.parametrize("static_kv_scale", (False, True))
@pytest.mark.parametrize("kv_page_stride", (16, 8))
def test_head_tasks_cache_modes(tokens, static_kv_scale, kv_page_stride):
    """Both KV-scale modes and both page strides, negative slots: q, index q,
    every cache byte and scale exact given the kernel's qkv; bytes the contract
    leaves alone (canaries) untouched."""
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, static_kv_scale=static_kv_scale,
                          kv_page_stride=kv_page_stride)
    inp = make_inputs(tokens, kernel.target.name, seed=1000 + tokens, kv_page_stride=kv_page_stride)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    launch(kernel, args)
    got = read_mailbox(kernel, ws["scratch"], tokens)
    want = reference_heads(inp, got["qkv"], args, static_kv_scale=static_kv_scale)
    for name in ("q_out", "iq_out", "k_cache", "v_cache", "k_scale", "v_scale", "index_cache"):
        assert same_bytes(args[name], want[name]), f"{name} differs"
    live = (inp["slot_mapping"] >= 0).sum().item()
    written = (args["k_scale"].cpu() != -7.0).sum().item()
    assert written == live, f"{written} K scales written for {live} live slots"
    if static_kv_scale:
        assert (args["k_scale"].cpu()[args["k_scale"].cpu() != -7.0] == 1.0).all()


def scoring_args(case: dict, inp: dict, q_len: int) -> dict:
    """The indexer's arguments of a context case; iscore filled with canaries."""
    return dict(seq_lens=case["seq_lens"].cuda(), block_table=case["block_table"].cuda(), bt_width=case["bt_cols"],
                q_len=q_len, index_cache=case["index_cache_bytes"].cuda().view(inp["fp8"]),
                iscore=torch.full((16 * 8192 * 8,), 0x5A, dtype=torch.uint8, device="cuda"))


def assert_iscore(iscore: torch.Tensor, tokens: int, scores, want, bound) -> torch.Tensor:
    """The launch wrote exactly the iscore pairs the reference scores (the
    current tag), -inf where it says -inf, every other value within the bound;
    returns the written mask."""
    pairs = iscore.cpu().view(torch.int32).view(16, 8192, 2)[:tokens]
    written = pairs[..., 1] == expected_tag(0)
    assert torch.equal(written, want), f"{(written != want).sum().item()} iscore slots differ in being written"
    got = pairs[..., 0].view(torch.float32)
    finite = torch.isfinite(scores[want])
    assert torch.equal(torch.isfinite(got[want]), finite), "-inf blocks differ"
    err = (got[want] - scores[want]).abs()[finite]
    assert (err <= bound[want][finite]).all(), f"max error {err.max().item()}"
    return written


SCORE_CASES = [  # (tokens, q_len, contexts of the requests' last rows[, init_blocks, local_blocks])
    (1, 1, [65536]),
    (1, 1, [2048]),             # 16 blocks: kept whole, nothing scored
    (4, 1, [1, 2049, 5000, 130]),
    (4, 2, [2065, 40000]),      # 17 blocks: one scored; rows masked by their own seq
    (16, 4, [3000, 2049, 65536, 100]),
    (16, 1, [4096 + 7 * i for i in range(16)]),
    (16, 16, [5000]),           # one request of 16 rows: both 8-row column blocks of a tile
    (15, 3, [4100, 2049, 9001, 100, 70000]),  # 15 rows (a segment of the GEMV in registers), 5 requests
    (4, 2, [5000, 70000], 1, 2),   # pinned first block, two local blocks
    (2, 1, [2200, 3000], 2, 1),
    (9, 1, [1 << 20]),          # 73719 items: past the block-table entries a CTA keeps in LDS (512 an sm90 CTA)
]


# the scorer's builds besides the spec's own (sm90: tensor cores by warp groups): other group
# sizes, the shortest key ring, and the CUDA-core dots in batches of two and of one; each must
# write the same scores
SCORER_TUNES = {"spec": None,  # sm90: tensor cores, each item the fewest warps that keep 8 of a CTA busy (8 .. 1)
                "busy-16": {"scores.busy_waves": 16},  # more warps an item: 8 .. 1
                "warp-owned": {"scores.busy_waves": 1},  # one warp an item, whatever the CTA's items
                # a ring of four tiles in LDS (the spec's sm90: 1 ahead, two tiles; above 8 rows in registers)
                "three-tiles-ahead": {"scores.tiles_ahead": 3, "scores.key_regs": 0},
                "bf16-dots": {"scores.f16_dots": 0},  # keys and index q in bf16 (one unscale), not f16 (the spec's)
                "iq-regs": {"scores.iq_regs": 1},  # block 0's B fragments in registers for an item
                # the keys by loads into registers, a tile ahead, no LDS ring (the spec's above 8 rows)
                "key-regs": {"scores.key_regs": 1, "scores.tiles_ahead": 1},
                "key-ring": {"scores.key_regs": 0},  # the keys through the LDS ring at every S
                "cuda-cores-batch2": {**CUDA_CORES, "scores.batch_items": 2},
                "cuda-cores-batch1": CUDA_CORES,
                # the first 4 items' keys into L2 during the GEMV at every S
                "keys-prefetch-4": {"scores.keys_prefetch": 1, "scores.keys_prefetch_items": 4, "scores.early_setup": 0},
                # ... above 2 rows from the early setup's pages, once the GEMV's rows are in
                "keys-prefetch-set-up": {"scores.keys_prefetch": 1, "scores.keys_prefetch_items": 8},
                "iq-first": {"scores.iq_first": 1},  # the index q made before the first key tiles are asked for
                # the CTA's items found by a walk over the requests, and an asked tile's item start from
                # the stream's count (the spec's sm90: from setup()'s table, and per unrolled tile)
                "items-walked": {"scores.item_table": 0, "scores.static_item_starts": 0},
                # the index q made again from the qkv rows by every scorer CTA (the spec's sm90 with four index
                # heads; with one it polls the tagged pairs the head task puts beside iq_out)
                "iq-made": {"scores.iq_from_out": 0, "heads.iq_tagged": 0},
                # every rank a round in turn (the spec's sm90: the late CTAs 4 / 6 items fewer, above 2
                # rows a second deal up to 24 items a CTA)
                "plain-deal": {"scores.late_ctas": 0, "scores.few_items": 0},
                # the head CTAs (ranks 112..131 from CTA 0) 2 items fewer at every S, whatever the items
                "late-ctas-2": {"scores.late_ctas": 20, "scores.late_items": 2, "scores.lead_cta": 0, "scores.few_items": 0},
                # the scorer's setup in its own stage (the spec's sm90: by the qkv GEMV CTAs above 2 rows)
                "setup-in-stage": {"scores.early_setup": 0},
                # the index q of every request (the spec's sm90 above one row: only those of the CTA's
                # items, which setup() marks); and those only on the CUDA-core dots
                "iq-all-requests": {"scores.iq_own_requests": 0},
                "iq-own-requests-cuda-cores": {**CUDA_CORES, "scores.iq_own_requests": 1}}


def scorer_kernel(tune_id: str, tokens: int, **params):
    tune = SCORER_TUNES[tune_id]
    if tune and not torch.version.cuda:
        pytest.skip("the scorer's dot knobs are sm90's")
    return codegen.load("minimax_m3/pre_attn", tokens=tokens, tune=tune, **params)


@pytest.mark.parametrize("tune_id", SCORER_TUNES)
@pytest.mark.parametrize("case_args", SCORE_CASES, ids=str)
def test_index_scores(case_args, tune_id):
    """Scores written exactly where the contract says (the current tag), within
    the f32-accumulation bound of a float64 reference on the kernel's own index
    q and index cache; every other iscore byte untouched."""
    tokens, q_len, contexts, *pinned = case_args
    init_blocks, local_blocks = pinned or (0, 1)
    kernel = scorer_kernel(tune_id, tokens, init_blocks=init_blocks, local_blocks=local_blocks)
    inp = make_inputs(tokens, kernel.target.name, seed=2000 + tokens + q_len)
    case = context_case(tokens, q_len, contexts, seed=tokens * 10 + q_len)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    args.update(scoring_args(case, inp, q_len))
    launch(kernel, args)
    scores, want, bound = reference_scores(args["iq_out"].cpu().view(tokens, 128), args["index_cache"].cpu(),
                                           case["block_table"], case["seq_lens"], q_len, init_blocks, local_blocks)
    written = assert_iscore(args["iscore"], tokens, scores, want, bound)
    untouched = args["iscore"].cpu().view(16, 8192, 8)
    assert (untouched[:tokens][~written] == 0x5A).all() and (untouched[tokens:] == 0x5A).all()
    # nothing unscored with this many tokens' contexts? at least one case scores something
    if max(contexts) > 2048:
        assert want.any()


@pytest.mark.parametrize("tokens", (1, 2, 3, 16))
@pytest.mark.parametrize("signal", (False, True))
def test_done_flags(tokens, signal):
    """Head-task flags (always) and residual flags (signal builds) set exactly
    for this launch's tokens and tasks, with the launch's tag; the rest stay."""
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, signal=signal)
    inp = make_inputs(tokens, kernel.target.name, seed=77 + tokens)
    ws = kernel.workspace("cuda")
    launch(kernel, launch_args(inp, ws))
    raw = ws["scratch"].cpu()

    def pairs(name):
        r = kernel.ir.region(name)
        return raw[r.offset: r.offset + r.nbytes].view(torch.int32).view(-1, 2)

    hdone = pairs("hdone").view(16, 20, 2)
    assert (hdone[:tokens, :, 1] == expected_tag(0)).all() and (hdone[:tokens, :, 0] == 1).all()
    assert (hdone[tokens:] == 0).all()
    rdone = pairs("rdone")
    if signal:
        assert (rdone[:tokens, 1] == expected_tag(0)).all() and (rdone[:tokens, 0] == 1).all()
        assert (rdone[tokens:] == 0).all()
    else:
        assert (rdone == 0).all(), "no residual flags without signal"


CP_CASES = [  # (tokens, q_len, contexts): long requests have more than 288 blocks
    (4, 1, [40000, 3000, 100, 65536]),   # long and short requests in one step
    (4, 2, [36865, 2000]),               # 289 blocks: just long
    (3, 1, [36864, 5000, 1]),            # 288 blocks: a short step (other heads not computed)
    (16, 4, [65536, 2049, 100000, 37000]),
    (2, 1, [40000, 100]),                # S <= 2: the other heads' GEMV reads the published rows
]


# the scorer tunes run with four index heads, on one rank (enough): not iq-made, the spec's there
CP_TUNES = [tune_id for tune_id in SCORER_TUNES if tune_id not in ("spec", "iq-made")]


@pytest.mark.parametrize("tune_id,own", [("spec", own) for own in range(4)] + [(tune_id, 1) for tune_id in CP_TUNES])
@pytest.mark.parametrize("tokens,q_len,contexts", CP_CASES)
def test_index_context_parallel(tune_id, own, tokens, q_len, contexts):
    """index_heads 4, rank `own`: own-head outputs and caches exact; the other
    heads' GEMV rows only in long steps; long requests score this rank's blocks
    for all 4 heads (pair h * 2048 + b / 4), short ones the own head."""
    kernel = scorer_kernel(tune_id, tokens, index_heads=4, index_own=own)
    inp = make_inputs(tokens, kernel.target.name, seed=3000 + 10 * own + tokens, index_heads=4)
    case = context_case(tokens, q_len, contexts, seed=own + tokens)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    args.update(scoring_args(case, inp, q_len))
    launch(kernel, args)
    got = read_mailbox(kernel, ws["scratch"], tokens)
    long_step = any(-(-int(case["seq_lens"][r * q_len + q_len - 1]) // 128) > 288 for r in range(tokens // q_len))
    base = 18 * 128
    for h in range(4):
        rows = slice(base + h * 128, base + (h + 1) * 128)
        fresh = (got["qkv_tag"][:, rows] == expected_tag(0))
        assert fresh.all() if (h == own or long_step) else not fresh.any(), f"head {h} rows (long step {long_step})"
    fresh_rows = (got["qkv_tag"] == expected_tag(0)).all(dim=0)
    qkv_ref = ref.qkv_gemv(got["x8"], got["x_scale"], inp["w"], inp["s_qkv"])
    ulps = ref.bf16_ulp_diff(got["qkv"][:, fresh_rows], qkv_ref[:, fresh_rows])
    assert ulps.max().item() <= 2 and (ulps <= 1).float().mean().item() >= 0.999

    heads = reference_heads(inp, got["qkv"], args, index_own=own)
    for name in ("q_out", "iq_out", "k_cache", "v_cache", "k_scale", "v_scale", "index_cache"):
        assert same_bytes(args[name], heads[name]), f"{name} differs"
    qkv_for_iq = got["qkv"].clone()
    if not long_step:  # stale rows of the other heads are never read
        qkv_for_iq[:, base:base + 512] = torch.where(fresh_rows[base:base + 512], qkv_for_iq[:, base:base + 512], 0.0)
    iq_all = ref.index_q_heads(qkv_for_iq, inp["g_iq"], inp["cos_sin"], inp["positions"], 1e-6, 4)
    scores, want, bound = reference_scores(iq_all, args["index_cache"].cpu(), case["block_table"], case["seq_lens"],
                                           q_len, index_heads=4, index_own=own)
    assert_iscore(args["iscore"], tokens, scores, want, bound)


@pytest.mark.parametrize("tune_id", SCORER_TUNES)
def test_index_scores_read_this_launchs_keys(tune_id):
    """Each row's new key at its own slot (position seq - 1 through its block
    table), some in scored blocks (q_len 4 just past a block boundary): the
    scorers read them only after the index-K head tasks, so the scores match the
    reference on the cache as the launch leaves it."""
    tokens, q_len, num_blocks = 16, 4, 1024
    kernel = scorer_kernel(tune_id, tokens)
    inp = make_inputs(tokens, kernel.target.name, seed=99, negative_slots=False)
    case = context_case(tokens, q_len, [128 * 20 + 1, 128 * 40 + 2, 5000, 128 * 17 + 3], seed=4,
                        num_blocks=num_blocks)
    seq, table = case["seq_lens"].long(), case["block_table"].long()
    pos = seq - 1
    inp["slot_mapping"] = table[torch.arange(tokens), pos // 128] * 128 + pos % 128
    inp["positions"] = pos % 4096
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws, num_blocks=num_blocks)
    args.update(scoring_args(case, inp, q_len))
    launch(kernel, args)
    scored_new = [(int(pos[k]) // 128) for k in range(tokens)
                  if int(pos[k]) // 128 < -(-int(seq[(k // q_len) * q_len + q_len - 1]) // 128) - 1]
    assert scored_new, "the case must put new keys into scored blocks"
    scores, want, bound = reference_scores(args["iq_out"].cpu().view(tokens, 128), args["index_cache"].cpu(),
                                           case["block_table"], case["seq_lens"], q_len)
    assert_iscore(args["iscore"], tokens, scores, want, bound)
