"""DeepSeek-V4.1 attn_front on the GPU against the PyTorch reference
(contract B, C.2; the checks and tolerances: tests/deepseek_case.py).

Builds: S in {1, 2, 3, 6, 16, 17, 48} (16, 17 and 48 through the xq stage; S = 1 and 2 with
wq_b norming q itself, q_inline, also against the publishing build), TP 2 and 4,
ratio 0 / 1 / 2, index and tuned on and off, timeline, QX8 with flags or as tagged pairs,
wq_b's MMAs two ways (native fp8 wgmma,
the spec's, checked against its own bound; `emulated`: mma.sync), the wgmma loops with 2 / 3 / 4
chunks in flight (the same bits; the spec's 3 at TP4), wq_b's
weights three ways (registers; TMA into LDS at wq_b's start, lds_weights; at the kernel's start,
bulk_weights); pad rows (slot -1),
SWA blocks of 64 and 128 tokens, padded block strides. Each build launches
twice (the second launch: the next epoch's tags, the same bits); one build
is replayed from a CUDA graph."""

from __future__ import annotations

import json
import os

import pytest
import torch

import codegen

from . import deepseek_case as dc
from .launch_guard import launch
from .graphs import assert_slots_at, capture

pytestmark = pytest.mark.gpu

SPEC = "deepseek_v41/attn_front"
# wq_b's weights by TMA into LDS at the kernel's start, or at wq_b's start: with the emulated MMAs
# (TP4's native wgmma takes its weights in registers)
BULK = {"tune": {"wq_b.bulk_weights": {"default": 0, "sm90": 1}, "wq_b.wgmma": 0}}
LDS = {"tune": {"wq_b.lds_weights": {"default": 0, "sm90": 1}, "wq_b.wgmma": 0}}
# wq_b on the emulated fp8 mma.sync instead of the spec's native wgmma (exact to 2^-22)
EMULATED = {"tune": {"wq_b.wgmma": 0}}
# X8 stored as wqkv's LDS image, each wqkv CTA's K part by one TMA copy (the spec's at TP4 from 10
# rows but 16)
X8_IMAGE = {"tune": {"symbols.X8_IMAGE": 1}}
# the last CTA out advances the epoch by an atomic round trip (the spec's: the CTAs finished over
# all launches / BLOCKS, each CTA counted out by a reduction nobody waits for)
EPOCH_LAST_OUT = {"tune": {"mailbox.advance": "last_out"}}
# ... or each CTA's own epoch in a scratch slot, CTA 0's copied into the counter (mailbox.advance slots)
EPOCH_SLOTS = {"tune": {"mailbox.advance": "slots"}}
# wqkv's and wq_b's wgmma loops with 2 / 4 chunks in flight (the spec's: 3 at TP4, wq_b's 2 at
# TP2); same sums, same order
DEPTH2 = {"tune": {"wqkv_a.wgmma_depth": 2, "wq_b.wgmma_depth": 2}}
DEPTH4 = {"tune": {"wqkv_a.wgmma_depth": 4, "wq_b.wgmma_depth": 4}}
# QX8 and its codes as tagged pairs that wq_b polls (no QRDY flags); with the emulated MMAs too
TAGGED = {"tune": {"symbols.QX8_TAGGED": 1}}
TAGGED_EMULATED = {"tune": {"symbols.QX8_TAGGED": 1, "wq_b.wgmma": 0}}
TUNED_TAGGED = {"tuned": True, **TAGGED}
# ... each poll round only the pieces not yet tagged (wq_b pending_polls; the spec's at TP4 S = 1 / 8)
PENDING = {"tune": {"symbols.QX8_TAGGED": 1, "wq_b.pending_polls": 1}}
# ... and 256 ns between a thread's poll rounds (wq_b poll_sleep)
SLEPT = {"tune": {"symbols.QX8_TAGGED": 1, "wq_b.pending_polls": 1, "wq_b.poll_sleep": 256}}
# tagged QX8 stored 4 times, wq_b's CTA c polling copy c % 4 (QX8_COPIES; the spec stores 2 at TP4 S = 7..10)
COPIES = {"tune": {"symbols.QX8_TAGGED": 1, "symbols.QX8_COPIES": 4}}
# wqkv's weights into L2 before the wait for the previous launch (l2_prefetch_at launch)
EARLY_PREFETCH = {"tune": {"wqkv_a.l2_prefetch": {"default": 0, "sm90": 1}, "wqkv_a.l2_prefetch_at": "launch"}}
# QX8 by flags and QRDY (the spec tags it up to 15 rows at TP4): 5 and 6 rows take two tokens a qkv task
FLAGS = {"tune": {"symbols.QX8_TAGGED": 0}}
TUNES = {id(BULK): "bulk", id(LDS): "lds", id(EMULATED): "emulated", id(X8_IMAGE): "x8image",
         id(EPOCH_LAST_OUT): "epoch-last-out", id(EPOCH_SLOTS): "epoch-slots",
         id(DEPTH2): "depth2", id(DEPTH4): "depth4", id(TAGGED): "tagged",
         id(TAGGED_EMULATED): "tagged-emulated", id(TUNED_TAGGED): "tagged",
         id(PENDING): "tagged-pending", id(SLEPT): "tagged-slept", id(COPIES): "tagged-copies",
         id(EARLY_PREFETCH): "early-prefetch", id(FLAGS): "flags"}
# (tokens, tp, ratio, flags, swa_block, pad rows, swa block padding); wq_b on wgmma unless EMULATED
# (TP2: 8 units a CTA, two groups of 4), wqkv in K quarters on wgmma at TP4; from S = 16
# (TP4) / 17 the qkv stage stores QX8 as wq_b's LDS image (one bulk copy; the EMULATED / LDS
# variants read its places by 16-byte loads)
CASES = [
    (1, 4, 1, {}, 128, (), 0),  # sm90: wqkv in K quarters, the QX8 hand-off (no q_inline at TP4)
    (2, 4, 2, {}, 64, (1,), 0),
    (2, 2, 1, {}, 128, (0,), 0),  # q_inline with two rows on the one qkv CTA (TP2)
    (9, 4, 2, {}, 64, (3,), 8),  # x quantized by every wqkv CTA, at its most rows (sm90 TP4); QX8 twice
    (8, 4, 1, {}, 128, (2,), 0),  # tagged QX8 in two copies (the spec's QX8_COPIES at TP4 7..10 rows)
    (5, 2, 1, {}, 128, (2,), 0),  # TP2: tagged QX8 in two copies (QX8_COPIES at TP2 3 / 5 / 11 rows)
    (11, 2, 2, {}, 64, (3,), 8),  # ... and 100 % shared memory (SMEM_CARVEOUT at TP2 9..15 rows)
    (3, 4, 1, {}, 64, (1,), 0),
    (6, 4, 2, {}, 64, (1, 4), 64),
    (16, 4, 0, {}, 128, (3,), 0),
    (17, 4, 1, {}, 64, (0, 16), 8),
    (5, 4, 2, {}, 64, (0, 4), 8),  # tagged QX8, one token a qkv task
    (5, 4, 2, FLAGS, 64, (0, 4), 8),  # two tokens a qkv task, the last one alone
    (6, 4, 1, FLAGS, 128, (2,), 0),
    (48, 4, 2, {}, 128, (5, 47), 0),
    (1, 2, 0, {}, 64, (), 0),
    (16, 2, 1, {}, 128, (2,), 64),
    (48, 2, 1, {}, 64, (7,), 0),
    (6, 4, 1, {"index": True}, 128, (2,), 0),
    (1, 4, 2, {"index": True}, 64, (), 0),
    (1, 2, 2, {"index": True}, 64, (), 0),  # q_inline: the qkv stage writes qr_out but no QX8
    (48, 2, 2, {"index": True}, 64, (1,), 8),
    (1, 4, 1, {"tuned": True}, 128, (), 0),
    (17, 2, 2, {"tuned": True}, 64, (3,), 0),
    (48, 4, 0, {"tuned": True, "index": True}, 128, (9,), 64),
    (6, 4, 1, {"timeline": True}, 64, (), 0),
    (1, 4, 2, BULK, 64, (), 0),
    (16, 4, 1, BULK, 128, (4,), 0),
    (1, 4, 1, LDS, 128, (), 0),
    (2, 4, 1, LDS, 64, (1,), 0),
    (16, 4, 2, LDS, 64, (5,), 0),
    (1, 4, 2, EMULATED, 64, (), 0),
    (3, 4, 1, EMULATED, 64, (1,), 0),
    (16, 4, 1, EMULATED, 128, (4,), 0),
    (48, 4, 2, EMULATED, 128, (5, 47), 0),
    (1, 2, 0, EMULATED, 64, (), 0),
    (48, 2, 1, EMULATED, 64, (7,), 0),
    (12, 4, 1, {}, 128, (5,), 8),  # X8 as wqkv's image (the spec's X8_IMAGE), 4 rows of padding
    (16, 4, 2, X8_IMAGE, 64, (3,), 0),
    (17, 2, 1, X8_IMAGE, 64, (0,), 0),  # TP2: the image's places by 16-byte loads
    (1, 4, 1, EPOCH_LAST_OUT, 128, (), 0),
    (16, 4, 2, EPOCH_LAST_OUT, 64, (3,), 0),
    (6, 4, 1, EPOCH_SLOTS, 128, (2,), 0),
    (48, 4, 2, EPOCH_SLOTS, 64, (5, 47), 0),
    (1, 4, 1, DEPTH2, 128, (), 0),
    (48, 4, 2, DEPTH2, 128, (5, 47), 0),
    (1, 4, 2, DEPTH4, 64, (), 0),
    (16, 4, 1, DEPTH4, 128, (4,), 0),
    (1, 4, 1, TAGGED, 128, (), 0),
    (6, 4, 2, TAGGED, 64, (1, 4), 64),
    (15, 4, 1, TAGGED, 128, (3,), 8),  # through the xq stage, the most rows without QX8's image
    (5, 4, 1, TAGGED, 64, (0,), 0),
    (6, 2, 1, TAGGED, 128, (2,), 0),
    (3, 4, 2, TAGGED_EMULATED, 64, (1,), 0),
    (6, 4, 1, TUNED_TAGGED, 64, (), 0),
    (6, 4, 2, PENDING, 128, (1, 4), 0),
    (15, 4, 1, PENDING, 64, (3,), 8),
    (12, 2, 1, PENDING, 64, (5,), 0),
    (6, 4, 1, SLEPT, 64, (2,), 8),
    (1, 4, 2, SLEPT, 128, (), 0),
    (6, 4, 2, COPIES, 64, (1, 4), 64),
    (15, 4, 1, COPIES, 128, (3,), 8),
    (1, 4, 1, EARLY_PREFETCH, 128, (), 0),
    (16, 4, 2, EARLY_PREFETCH, 64, (3,), 0),
    (48, 4, 0, DEPTH4, 64, (1,), 8),
    (48, 2, 1, DEPTH4, 64, (7,), 0),  # TP2: wq_b's two groups of 4 units
]
STATS: dict = {}


def case_id(c):
    s, tp, ratio, flags, blk, pads, pad = c
    tags = [TUNES[id(flags)] if k == "tune" else k for k in flags]
    return f"s{s}-tp{tp}-r{ratio}" + "".join(f"-{k}" for k in tags) + f"-b{blk}"


@pytest.fixture(scope="module", autouse=True)
def _builds_compiled():
    """Compile every build ahead in parallel (into $MONO_CACHE_DIR, when set);
    write the measured error statistics at the end."""
    if os.environ.get("MONO_CACHE_DIR") and torch.cuda.is_available():
        dc.precompile([dict(tokens=c[0], tp=c[1], ratio=c[2], **c[3]) for c in CASES])
    yield
    out = os.environ.get("OUT")
    if out and STATS:
        with open(os.path.join(out, "deepseek_front_stats.json"), "w") as f:
            json.dump(STATS, f, indent=1)


def setup(c, seed=0, pdl=True, cooperative=True):
    s, tp, ratio, flags, blk, pads, pad = c
    kernel = codegen.load(SPEC, tokens=s, tp=tp, ratio=ratio, pdl=pdl, cooperative=cooperative, **flags)
    case = dc.make_case(s, tp, ratio, kernel.target.name, seed=seed + 11 * s + tp + ratio, swa_block=blk,
                        pad_rows=pads, swa_pad=pad)
    ws = kernel.workspace("cuda")
    return kernel, case, dc.launch_args(case, ws)


@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_front(c):
    kernel, case, args = setup(c)
    launch(kernel, args)
    stats = dc.check(case, kernel.ir, args, epoch=0)
    assert args["epoch"].cpu().tolist() == kernel.ir.advanced([0, 0]), "the kernel advanced its counter once"
    assert kernel.ir.epoch(args["epoch"].cpu()) == 1
    first = dc.read_scratch(kernel.ir, args["scratch"], case.tokens)
    q_first = args["q"].clone()

    # again: the next epoch's tags, the same bits (q poisoned in between)
    args["q"].view(torch.int16).fill_(dc.POISON_BF16)
    launch(kernel, args)
    stats2 = dc.check(case, kernel.ir, args, epoch=1)
    again = dc.read_scratch(kernel.ir, args["scratch"], case.tokens)
    assert torch.equal(again["partials"], first["partials"]) and torch.equal(again["qx8"].view(torch.uint8), first["qx8"].view(torch.uint8))
    assert torch.equal(args["q"].view(torch.int16), q_first.view(torch.int16))
    STATS[case_id(c)] = stats | {"second": stats2}
    if c[3].get("index"):  # qr_out is optional: None is not written (and nothing else changes)
        launch(kernel, dict(args, qr_out=None))
        assert torch.equal(args["q"].view(torch.int16), q_first.view(torch.int16))
    if c[3].get("timeline"):
        tl = args["tl"].cpu()
        pts = kernel.ir.timeline_points
        start, done = tl[:, pts.index("start")], tl[:, pts.index("stages_done")]
        assert (start > 0).all() and (done >= start).all()
        for p in ("kt_done", "wqkv_done", "qkv_done", "wqb_done"):
            v = tl[:, pts.index(p)]
            assert ((v == 0) | ((v >= start) & (v <= done))).all(), p
        wqb_ctas = next(c.value for c in kernel.ir.constants if c.name == "WQB_CTAS")  # wq_b: CTAs 0 .. WQB_CTAS - 1
        has_wqb = tl[:, pts.index("wqb_done")] > 0
        assert has_wqb[:wqb_ctas].all() and not has_wqb[wqb_ctas:].any(), "wq_b tasks on exactly its CTAs"


@pytest.mark.parametrize("s", [1, 6])
def test_q_inline_same_bits(s):
    """wq_b's CTAs norming the q latent themselves (q_inline) write the very q and records of
    the build in which the qkv stage publishes QX8 (same inputs): the q math is one macro."""
    builds = [codegen.load(SPEC, tokens=s, tune={"symbols.INLINE_Q_TOKENS": n}) for n in (s, 0)]
    assert [dc.publishes_qx8(k.ir) for k in builds] == [False, True]
    case = dc.make_case(s, 4, 1, "sm90", seed=31 + s, pad_rows=(1,) if s > 1 else ())
    outs = []
    for kernel in builds:
        args = dc.launch_args(case, kernel.workspace("cuda"))
        launch(kernel, args)
        dc.check(case, kernel.ir, args)
        outs.append((args["q"].view(torch.int16).cpu(), args["swa"].cpu()))
    assert torch.equal(outs[0][0], outs[1][0]), "q differs between the q_inline and the publishing build"
    assert torch.equal(outs[0][1], outs[1][1]), "the SWA records differ"


def checked_bits(kernel, case) -> dict:
    """One launch of ``kernel`` on ``case``, checked against the contract: the bits of its
    partials, QX8, q and SWA records."""
    args = dc.launch_args(case, kernel.workspace("cuda"))
    launch(kernel, args)
    dc.check(case, kernel.ir, args)
    scratch = dc.read_scratch(kernel.ir, args["scratch"], case.tokens)
    return {"partials": scratch["partials"].view(torch.int32), "qx8": scratch["qx8"].view(torch.uint8),
            "q": args["q"].view(torch.int16).cpu(), "swa records": args["swa"].cpu()}


@pytest.mark.parametrize("s, tp", [(1, 4), (16, 4), (48, 4), (48, 2)])
def test_wgmma_depth_same_bits(s, tp):
    """More chunks in flight changes when the wgmma loop waits, not what it sums nor the order:
    depth 3 and 4 write depth 2's very partials, QX8, q and records."""
    case = dc.make_case(s, tp, 1, "sm90", seed=41 + s + tp, pad_rows=(1,) if s > 1 else ())
    outs = [checked_bits(codegen.load(SPEC, tokens=s, tp=tp, tune={"wqkv_a.wgmma_depth": d, "wq_b.wgmma_depth": d}), case)
            for d in (2, 3, 4)]
    for d, out in zip((3, 4), outs[1:]):
        for name in out:
            assert torch.equal(out[name], outs[0][name]), f"depth {d}: {name} differ from depth 2's"


@pytest.mark.parametrize("s, tp", [(1, 4), (6, 4), (12, 2)])
def test_tagged_qx8_same_bits(s, tp):
    """QX8 as tagged pairs changes how wq_b learns that its rows are there, not what they are:
    the same partials, QX8, q and records as the build with QRDY flags; so do 3 copies of the
    pairs (QX8_COPIES: wq_b's CTAs poll one copy each; dc.check wants every copy the first's)."""
    case = dc.make_case(s, tp, 1, "sm90", seed=53 + s + tp, pad_rows=(1,) if s > 1 else ())
    flagged, tagged, copies = (checked_bits(codegen.load(SPEC, tokens=s, tp=tp, tune=tune), case)
                               for tune in ({"symbols.QX8_TAGGED": 0}, {"symbols.QX8_TAGGED": 1},
                                            {"symbols.QX8_TAGGED": 1, "symbols.QX8_COPIES": 3}))
    for name in flagged:
        assert torch.equal(tagged[name], flagged[name]), f"tagged: {name} differ from the flagged build's"
        assert torch.equal(copies[name], flagged[name]), f"tagged, 3 copies: {name} differ from the flagged build's"


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "no-pdl"])
@pytest.mark.parametrize("flags", [{}, EPOCH_LAST_OUT, EPOCH_SLOTS, TAGGED, EARLY_PREFETCH, "not cooperative"],
                         ids=["spec", "epoch-last-out", "epoch-slots", "tagged", "early-prefetch",
                              "not-cooperative"])
def test_graph_replays(flags, pdl):
    """5 replays of a graph of 4 launches in a row, nothing cleared in between: the same
    outputs, the epoch advanced once per launch on the device (every way of keeping the
    counter: the last CTA out, or the CTAs counted over all launches, or each CTA's own slot,
    every slot at the counter's epoch after them;
    launches overlapping their neighbours by programmatic dependent launch, the default, or
    one after the other;
    wqkv's weights prefetched before the wait for the previous launch, launched without the
    cooperative attribute as the prefetch is meant to be)."""
    cooperative = flags != "not cooperative" and flags is not EARLY_PREFETCH
    c = (6, 4, 1, flags if isinstance(flags, dict) else {}, 64, (1,), 0)
    kernel, case, args = setup(c, seed=5, pdl=pdl, cooperative=cooperative)
    launch(kernel, args)
    q1 = args["q"].clone()
    graph = capture(lambda: kernel(**args), times=4)
    torch.cuda.synchronize()
    before = kernel.ir.epoch(args["epoch"].cpu())
    want = args["epoch"].cpu().tolist()
    for _ in range(5):
        graph.replay()
        want = kernel.ir.advanced(want, 4)
    torch.cuda.synchronize()
    assert kernel.ir.epoch(args["epoch"].cpu()) == before + 20 and args["epoch"].cpu().tolist() == want
    assert_slots_at(kernel.ir, args["scratch"], before + 20)
    assert torch.equal(args["q"].view(torch.int16), q1.view(torch.int16))
    dc.check(case, kernel.ir, args, epoch=before + 19)


@pytest.mark.parametrize("tokens", [1, 6])
def test_load_sets_the_smem_carveout(tokens):
    """The loaded function carries the build's grid.smem_carveout (TP4: 100 at S = 1, 0 at 6), read
    back from the driver (the file's other cases launch these builds and check their outputs)."""
    kernel = codegen.load(SPEC, tokens=tokens, tp=4, ratio=1)
    if kernel.target.vendor != "nvidia":
        pytest.skip("the carveout is NVIDIA's")
    assert kernel.ir.smem_carveout == (100 if tokens == 1 else 0)
    fn = kernel.compile()
    assert fn._attr("CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT") == kernel.ir.smem_carveout
