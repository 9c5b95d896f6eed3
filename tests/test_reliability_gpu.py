"""Reliability on the GPU (the lent H200): hangs become errors in debug builds,
10,000 graph replays without clearing anything, NaN / Inf inputs; for
MiniMax-M3 pre_attn and (the second half of this file) DeepSeek-V4.1
attn_front.

* A debug build computes what the release build computes, and a wait that can
  never be satisfied (the norm stage cut out of the source, so nothing ever
  publishes the FP8 rows' scales) ends in ``KernelHang`` within 2 s, naming
  the stage and the region, instead of a hang; the next launch is clean.
* 10,000 replays (a graph of 100 launches, replayed 100 times), scratch never
  cleared: outputs identical to a single launch, the epoch advanced by 10,000.
* NaN and Inf in the inputs: the kernel finishes, and writes only its outputs
  (every tensor argument sits between canary bytes; inputs stay unchanged).

Every wait for the GPU goes through ``finish`` (an event polled with a
deadline): a hang fails the test instead of blocking it."""

from __future__ import annotations

import time

import pytest
import torch

import codegen
from codegen.launch import Kernel, KernelHang
from codegen.lower import HANG_REGION
from tests.graphs import capture
from tests import deepseek_case as dc
from tests.minimax_case import expected_tag, launch_args, make_inputs, read_mailbox

pytestmark = pytest.mark.gpu

SPEC = "minimax_m3/pre_attn"
PAD = 256  # canary bytes before and after each tensor (keeps 16-byte alignment)
CANARY = 0xA5


def finish(seconds: float = 60.0) -> float:
    """Wait for the current stream with a deadline; the seconds it took.
    A kernel that does not finish fails the test (the process may stay stuck)."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.perf_counter()
    while not ev.query():
        if time.perf_counter() - t0 > seconds:
            pytest.fail(f"the kernel did not finish within {seconds} s: a hang")
        time.sleep(0.001)
    return time.perf_counter() - t0


def outputs(kernel, args: dict) -> dict:
    """Bytes of every tensor the kernel writes (workspaces aside), on the CPU."""
    out = {}
    for a in kernel.ir.abi:
        if a.is_tensor and a.intent != "in" and a.workspace is None and args.get(a.name) is not None:
            out[a.name] = args[a.name].detach().cpu().contiguous().view(torch.uint8).clone()
    return out


def scratch_regions(kernel, scratch: torch.Tensor) -> dict:
    raw = scratch.cpu()
    return {r.name: raw[r.offset: r.offset + r.nbytes].clone() for r in kernel.ir.regions if r.name != HANG_REGION}


def pair_values(raw: torch.Tensor) -> torch.Tensor:
    """The value words of a buffer of (value, tag) pairs."""
    return raw.view(torch.int32).view(-1, 2)[:, 0]


# ---- debug builds ----------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", (1, 4, 16))
def test_debug_build_computes_what_the_release_build_does(tokens):
    got = {}
    for debug in (False, True):
        kernel = codegen.load(SPEC, tokens=tokens, debug=debug)
        inp = make_inputs(tokens, kernel.target.name, seed=50 + tokens)
        ws = kernel.workspace("cuda")
        args = launch_args(inp, ws)
        kernel(**args)  # a debug build checks its hang record after the launch
        finish()
        kernel.check_errors()
        got[debug] = (outputs(kernel, args), scratch_regions(kernel, ws["scratch"]), ws["step"].cpu().tolist())
    assert got[True][2] == got[False][2] == kernel.ir.advanced([0, 0])
    for name, value in got[False][0].items():
        assert torch.equal(got[True][0][name], value), f"{name} differs in the debug build"
    for name, value in got[False][1].items():
        assert torch.equal(got[True][1][name], value), f"scratch region {name} differs in the debug build"


def norm_regions(kernel) -> set[str]:
    """The scratch regions the norm stage publishes (what its readers wait on)."""
    norm = next(s for s in kernel.ir.stages if s.kind == "rmsnorm_fp8")
    names = {r.name for r in kernel.ir.regions}
    return {v for v in norm.values["fields"].model_dump().values() if isinstance(v, str) and v in names}


def test_unsatisfiable_wait_raises_kernel_hang_within_2s():
    """The norm stage cut out of a debug build's source: the GEMV's wait for the
    rows' scales can never be satisfied."""
    tokens = 4
    kernel = codegen.load(SPEC, tokens=tokens, debug=True)
    norm = next(s for s in kernel.ir.stages if s.kind == "rmsnorm_fp8")
    call = f"    stage_{norm.name}::run(a, mb, lds);\n"
    assert kernel.source.count(call) == 1
    broken = kernel.with_source(kernel.source.replace(call, ""))
    broken.compile()
    inp = make_inputs(tokens, kernel.target.name, seed=11)
    ws = broken.workspace("cuda")
    args = launch_args(inp, ws)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with pytest.raises(KernelHang) as e:
        broken(**args)  # launch, then check_errors (synchronizes)
    took = time.perf_counter() - t0
    rec = e.value.record
    print(f"KernelHang after {took:.2f} s: {e.value}")
    assert took < 2.0, f"{took:.2f} s"
    assert rec["region"] in norm_regions(kernel), rec
    assert rec["stage"] is not None and rec["stage"] != norm.name, rec
    assert rec["tag"] == expected_tag(0) and rec["seen"] != rec["tag"] and rec["waits"] >= 1
    assert f"'{rec['stage']}'" in str(e.value) and f"region '{rec['region']}'" in str(e.value)
    assert ws["step"].cpu().tolist() == kernel.ir.advanced([0, 0]), "the launch ran to its end"

    # the record was cleared: the real debug kernel runs clean on the same workspace
    kernel(**launch_args(inp, ws))
    finish()
    kernel.check_errors()
    assert (read_mailbox(kernel, ws["scratch"], tokens)["x8s_tag"] == expected_tag(1)).all()


def test_hang_in_graph_replays_is_reported_by_check_errors():
    """Inside a graph capture the launcher cannot check: check_errors after the
    replays reports the hang of any of them."""
    tokens = 4
    kernel = codegen.load(SPEC, tokens=tokens, debug=True)
    norm = next(s for s in kernel.ir.stages if s.kind == "rmsnorm_fp8")
    broken = kernel.with_source(kernel.source.replace(f"    stage_{norm.name}::run(a, mb, lds);\n", ""))
    broken.compile()
    ws = broken.workspace("cuda")
    args = launch_args(make_inputs(tokens, kernel.target.name, seed=12), ws)
    graph = capture(lambda: broken(**args))
    graph.replay()
    graph.replay()
    finish(10.0)
    with pytest.raises(KernelHang):
        broken.check_errors(ws["scratch"])
    broken.check_errors(ws["scratch"])  # cleared


# ---- 10,000 replays --------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", (1, 16))
def test_ten_thousand_graph_replays(tokens):
    kernel = codegen.load(SPEC, tokens=tokens)
    inp = make_inputs(tokens, kernel.target.name, seed=300 + tokens)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    kernel(**args)  # compile, and the single launch to compare with
    finish()
    single_out = outputs(kernel, args)
    single = read_mailbox(kernel, ws["scratch"], tokens)

    graph = capture(lambda: kernel(**args), times=100)
    finish()
    counter0 = ws["step"].cpu().tolist()
    before = kernel.ir.epoch(counter0)
    t0 = time.perf_counter()
    for _ in range(100):
        graph.replay()
    took = finish(120.0)
    print(f"10,000 launches of S={tokens}: {took * 1e2:.1f} us each (replay loop {time.perf_counter() - t0:.2f} s)")
    after = ws["step"].cpu().tolist()
    assert after == kernel.ir.advanced(counter0, 10_000), "the counter advances once per launch, on the device"
    assert kernel.ir.epoch(after) == before + 10_000

    got = read_mailbox(kernel, ws["scratch"], tokens)
    assert torch.equal(got["qkv"], single["qkv"]) and torch.equal(got["x_scale"], single["x_scale"])
    assert torch.equal(got["x8"].view(torch.uint8), single["x8"].view(torch.uint8))
    assert (got["qkv_tag"] == expected_tag(before + 9_999)).all(), "every pair carries the last launch's tag"
    if tokens > 2:
        assert (got["x8s_tag"] == expected_tag(before + 9_999)).all()
    final = outputs(kernel, args)
    for name, value in single_out.items():
        if name == "iscore":  # (value, tag) pairs: the values equal, the tags are the last launch's
            assert torch.equal(pair_values(final[name]), pair_values(value)), name
        else:
            assert torch.equal(final[name], value), f"{name} differs after 10,000 launches"


# ---- NaN / Inf inputs ---------------------------------------------------------------------------


def embed(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` copied into the middle of a larger byte buffer whose PAD bytes on
    each side hold CANARY: (the buffer, the view to pass, contiguous and aligned)."""
    n = t.numel() * t.element_size()
    buf = torch.full((PAD + n + PAD,), CANARY, dtype=torch.uint8, device=t.device)
    buf[PAD: PAD + n] = t.contiguous().view(-1).view(torch.uint8)
    view = buf[PAD: PAD + n].view(t.dtype).view(t.shape)
    assert view.is_contiguous() and view.data_ptr() % 16 == 0
    return buf, view

def launch_twice_between_canaries(kernel, args: dict) -> None:
    """Every tensor argument moved between canary bytes (scratch: after its end), two
    launches (the second over the first one's NaNs in scratch), then: no canary byte
    touched, no input written, the launch counter back to 0 after two epochs. ``args``
    keeps the embedded views, for the caller's checks of the outputs."""
    n = args[kernel.ir.scratch_arg].numel()
    scratch_buf = torch.full((n + PAD,), CANARY, dtype=torch.uint8, device="cuda")
    scratch_buf[:n] = 0
    args[kernel.ir.scratch_arg] = scratch_buf[:n]
    bufs = {}
    for a in kernel.ir.abi:
        if a.is_tensor and a.name != kernel.ir.scratch_arg and args.get(a.name) is not None:
            bufs[a.name], args[a.name] = embed(args[a.name])
    inputs_before = {a.name: bufs[a.name].cpu().clone() for a in kernel.ir.abi if a.name in bufs and a.intent == "in"}

    kernel.compile()
    torch.cuda.synchronize()
    kernel(**args)
    finish(30.0)
    kernel(**args)  # and a second launch over the first one's NaNs in scratch
    finish(30.0)

    assert (scratch_buf[-PAD:] == CANARY).all(), "bytes written past the end of scratch"
    for name, buf in bufs.items():
        host = buf.cpu()
        assert (host[:PAD] == CANARY).all(), f"bytes written before {name}"
        assert (host[-PAD:] == CANARY).all(), f"bytes written after {name}"
        if name in inputs_before:
            assert torch.equal(host, inputs_before[name]), f"input {name} was written"
    assert args[kernel.ir.counter_arg].cpu().tolist() == kernel.ir.advanced([0, 0], 2)



def poison_inputs(inp: dict, tokens: int) -> dict:
    """NaN and +-Inf in the activations, the norm weights and the weight scales."""
    nan, inf = float("nan"), float("inf")
    inp = dict(inp)
    ar, res = inp["ar"].clone(), inp["res"].clone()
    ar[0, ::7] = nan
    res[min(1, tokens - 1), ::5] = inf
    res[min(1, tokens - 1), 3] = -inf
    inp["ar"], inp["res"] = ar, res
    for k in ("g_in", "g_q", "g_k", "g_iq", "g_ik"):
        g = inp[k].clone()
        g[3] = nan
        g[4] = inf
        inp[k] = g
    s = inp["s_qkv"].clone()
    s[5], s[77] = inf, nan
    inp["s_qkv"] = s
    w = inp["w"].clone()
    w[7, 11] = torch.tensor(nan).to(w.dtype)
    inp["w"] = w
    return inp


@pytest.mark.parametrize("tokens", (1, 4, 16))
def test_nan_inf_inputs_finish_and_write_only_outputs(tokens):
    kernel = codegen.load(SPEC, tokens=tokens)
    clean = make_inputs(tokens, kernel.target.name, seed=900 + tokens)
    inp = poison_inputs(clean, tokens)
    args = launch_args(inp, kernel.workspace("cuda"))
    launch_twice_between_canaries(kernel, args)

    # rows without NaN / Inf give what clean inputs give (rows are independent up to the GEMV)
    if tokens > 2:
        ref_kernel_args = launch_args(clean, kernel.workspace("cuda"))
        kernel(**ref_kernel_args)
        finish(30.0)
        h, h_ref = args["h_out"].cpu(), ref_kernel_args["h_out"].cpu()
        assert torch.equal(h[2:].view(torch.int16), h_ref[2:].view(torch.int16)), "h_out of the clean rows"


# ---- argument checks that need the GPU -------------------------------------------------------


def test_misaligned_and_wrong_device_arguments():
    """Each tensor argument moved off its 16-byte alignment (by one element) is
    refused by name; so is a tensor on another GPU (where there is one)."""
    from codegen.launch import ArgumentError

    tokens = 2
    kernel = codegen.load(SPEC, tokens=tokens)
    ws = kernel.workspace("cuda")
    args = launch_args(make_inputs(tokens, kernel.target.name, seed=5), ws)
    kernel.pack(args)  # all good
    for a in kernel.ir.abi:
        t = args.get(a.name)
        if not a.is_tensor or t is None:
            continue
        size = t.element_size()
        if size >= 16:
            continue
        raw = torch.empty(t.numel() * size + 16, dtype=torch.uint8, device="cuda")
        moved = raw[size: size + t.numel() * size].view(t.dtype).view(t.shape)
        assert moved.is_contiguous() and moved.data_ptr() % 16
        with pytest.raises(ArgumentError, match=rf"argument '{a.name}': expected a 16-byte aligned address"):
            kernel.pack(dict(args, **{a.name: moved}))
    if torch.cuda.device_count() > 1:
        other = args["ar"].to("cuda:1")
        with pytest.raises(ArgumentError, match=r"argument 'ar': expected device cuda:0"):
            kernel.pack(dict(args, ar=other))


def test_written_arguments_sharing_memory_refused():
    """With GPU tensors: the tests' own arguments pass the overlap check (MiniMax's packed K / V
    views, kv_page_stride 16, overlap as the spec allows); an output over an input (h_out in
    place of res) is refused by name before any launch, and res is left as it was."""
    from codegen.launch import ArgumentError

    kernel = codegen.load(SPEC, tokens=2)
    args = launch_args(make_inputs(2, kernel.target.name, seed=5), kernel.workspace("cuda"))
    k, v = args["k_cache"], args["v_cache"]
    assert k.data_ptr() < v.data_ptr() < k.data_ptr() + k.nbytes
    kernel.pack(args)
    before = args["res"].clone()
    with pytest.raises(ArgumentError, match=r"arguments '(res|h_out)' .* share memory, and the kernel writes 'h_out'"):
        kernel(**dict(args, h_out=args["res"]))
    torch.cuda.synchronize()
    assert torch.equal(args["res"].view(torch.int16), before.view(torch.int16))


# ---- DeepSeek-V4.1 attn_front ------------------------------------------------------------------
# The same properties for the DeepSeek front (tests/deepseek_case.py: inputs, launch arguments,
# mailboxes and the reference checks): its tag is 2 epoch + 1 (no layer), its S > 8 builds
# publish x through the xq stage's flags, tuned builds keep 8 copies of every flag.

DS_SPEC = "deepseek_v41/attn_front"


def ds_setup(tokens: int, seed: int, tp: int = 4, ratio: int = 1, swa_block: int = 64, pad_rows=(1,), **flags):
    """A DeepSeek build, its test case and launch arguments (workspace included)."""
    kernel = codegen.load(DS_SPEC, tokens=tokens, tp=tp, ratio=ratio, **flags)
    case = dc.make_case(tokens, tp, ratio, kernel.target.name, seed=seed, swa_block=swa_block, pad_rows=pad_rows)
    return kernel, case, dc.launch_args(case, kernel.workspace("cuda"))


def ds_tag(epoch: int) -> int:
    return 2 * epoch + 1


@pytest.mark.parametrize("tokens", (1, 17, 48))
def test_deepseek_debug_build_computes_what_the_release_build_does(tokens):
    got = {}
    for debug in (False, True):
        kernel, case, args = ds_setup(tokens, seed=50 + tokens, debug=debug)
        kernel(**args)  # a debug build checks its hang record after the launch
        finish()
        kernel.check_errors()
        dc.check(case, kernel.ir, args, epoch=0)
        got[debug] = (outputs(kernel, args), scratch_regions(kernel, args["scratch"]), args["epoch"].cpu().tolist())
    assert got[True][2] == got[False][2] == kernel.ir.advanced([0, 0])
    for name, value in got[False][0].items():
        assert torch.equal(got[True][0][name], value), f"{name} differs in the debug build"
    for name, value in got[False][1].items():
        assert torch.equal(got[True][1][name], value), f"scratch region {name} differs in the debug build"


def ds_broken(kernel, stage: str) -> Kernel:
    """``kernel`` with the call of ``stage`` cut out of its source: what that stage
    publishes never comes."""
    call = f"    stage_{stage}::run(a, mb, lds);\n"
    assert kernel.source.count(call) == 1
    broken = kernel.with_source(kernel.source.replace(call, ""))
    broken.compile()
    return broken


# (tokens, the stage cut out, the (stage, region) pairs whose wait may give up first, build flags)
DS_HANGS = [
    # S <= 8: wqkv_a quantizes x itself; only wq_b waits (on QX8's flags, where QX8 is not tagged pairs)
    (4, "qkv", {("wq_b", "qrdy")}, {"tune": {"symbols.QX8_TAGGED": 0}}),
    (17, "xq", {("wqkv_a", "xrdy")}, {}),  # S > 8: every wqkv unit waits on xq's flags first
    # QX8 as tagged pairs: wq_b polls the rows and codes themselves
    (4, "qkv", {("wq_b", "qx8"), ("wq_b", "qx8s")}, {"tune": {"symbols.QX8_TAGGED": 1}}),
    (6, "qkv", {("wq_b", "qx8"), ("wq_b", "qx8s")}, {"tune": {"symbols.QX8_TAGGED": 1, "wq_b.pending_polls": 1, "wq_b.poll_sleep": 256}}),
]


@pytest.mark.parametrize("tokens,cut,where,flags", DS_HANGS, ids=["s4-no-qkv", "s17-no-xq", "s4-no-qkv-tagged", "s6-no-qkv-pending-slept"])
def test_deepseek_unsatisfiable_wait_raises_kernel_hang_within_2s(tokens, cut, where, flags):
    kernel, case, args = ds_setup(tokens, seed=11, debug=True, **flags)
    st = {s.name: s for s in kernel.ir.stages}
    if cut == "xq" and kernel.ir.blocks > st["wqkv_a"].tasks:
        where = where | {("wq_b", "qrdy")}  # AMD: CTAs without a wqkv unit go straight to wq_b's wait
    wqkv_ctas = range(st["wqkv_a"].first, st["wqkv_a"].first + st["wqkv_a"].ctas)
    qkv_ctas = range(st["qkv"].first, st["qkv"].first + min(st["qkv"].tasks, st["qkv"].ctas))
    if cut == "xq" and any(c not in wqkv_ctas for c in qkv_ctas):
        where = where | {("qkv", "qkvp")}  # sm90: qkv CTAs without a wqkv unit wait on its partials at once
    broken = ds_broken(kernel, cut)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with pytest.raises(KernelHang) as e:
        broken(**args)  # launch, then check_errors (synchronizes)
    took = time.perf_counter() - t0
    rec = e.value.record
    print(f"KernelHang after {took:.2f} s: {e.value}")
    assert took < 2.0, f"{took:.2f} s"
    assert (rec["stage"], rec["region"]) in where, rec
    assert rec["tag"] == ds_tag(0) and rec["seen"] != rec["tag"] and rec["waits"] >= 1
    assert f"'{rec['stage']}'" in str(e.value) and f"region '{rec['region']}'" in str(e.value)
    assert "layer" not in str(e.value), "the DeepSeek tag has no layer"
    assert args["epoch"].cpu().tolist() == kernel.ir.advanced([0, 0]), "the launch ran to its end"

    # the record was cleared: the real debug kernel runs clean on the same workspace (epoch 1)
    args = dc.launch_args(case, {"scratch": args["scratch"], "epoch": args["epoch"], "tl": None})
    kernel(**args)
    finish()
    kernel.check_errors()
    dc.check(case, kernel.ir, args, epoch=1)


def test_deepseek_hang_in_graph_replays_is_reported_by_check_errors():
    kernel, case, args = ds_setup(4, seed=12, debug=True, tune={"symbols.QX8_TAGGED": 0})  # a wait on QX8's flags
    broken = ds_broken(kernel, "qkv")
    graph = capture(lambda: broken(**args))
    graph.replay()
    graph.replay()
    finish(10.0)
    with pytest.raises(KernelHang, match=r"'wq_b'.*region 'qrdy'"):
        broken.check_errors(args["scratch"])
    broken.check_errors(args["scratch"])  # cleared
    assert args["epoch"].cpu().tolist() == kernel.ir.advanced([0, 0], 2)


@pytest.mark.parametrize("tokens,flags", [(1, {}), (17, {}), (48, {"tuned": True})], ids=["s1", "s17", "s48-tuned"])
def test_deepseek_ten_thousand_graph_replays(tokens, flags):
    """100 launches captured in a graph, replayed 100 times, scratch never
    cleared: every output byte (q, the key table, the SWA cache) and every
    mailbox value as after one launch, every tag the last launch's, the epoch
    advanced by 10,000 on the device."""
    kernel, case, args = ds_setup(tokens, seed=300 + tokens, pad_rows=(0,) if tokens > 1 else (), **flags)
    kernel(**args)  # compile, and the single launch to compare with
    finish()
    dc.check(case, kernel.ir, args, epoch=0)
    single_out = outputs(kernel, args)
    single = dc.read_scratch(kernel.ir, args["scratch"], tokens)

    graph = capture(lambda: kernel(**args), times=100)
    finish()
    counter0 = args["epoch"].cpu().tolist()
    before = kernel.ir.epoch(counter0)
    assert before == 1, "capturing launches nothing"
    t0 = time.perf_counter()
    for _ in range(100):
        graph.replay()
    took = finish(120.0)
    print(f"10,000 DeepSeek launches of S={tokens} {flags}: {took * 1e2:.1f} us each "
          f"(replay loop {time.perf_counter() - t0:.2f} s)")
    after = args["epoch"].cpu().tolist()
    assert after == kernel.ir.advanced(counter0, 10_000), "the counter advances once per launch, on the device"
    assert kernel.ir.epoch(after) == before + 10_000

    got = dc.read_scratch(kernel.ir, args["scratch"], tokens)
    for name in ("partials", "x8s", "qx8s"):
        assert torch.equal(got[name], single[name]), name
    for name in ("x8", "qx8"):
        assert torch.equal(got[name].view(torch.uint8), single[name].view(torch.uint8)), name
    last = ds_tag(before + 9_999)
    assert (got["partials_tag"] == last).all(), "every partial carries the last launch's tag"
    final = outputs(kernel, args)
    for name, value in single_out.items():
        assert torch.equal(final[name], value), f"{name} differs after 10,000 launches"
    dc.check(case, kernel.ir, args, epoch=before + 9_999)  # flags of every copy, the last launch's tags


def ds_poison(case: dc.Case, everything: bool) -> dc.Case:
    """NaN and +-Inf in x's rows 0 and 1; with ``everything`` also in both norm
    weights, token 0's cos/sin row, both weights' bytes and their E8M0 codes
    (255: the NaN scale)."""
    import dataclasses

    nan, inf = float("nan"), float("inf")
    s = case.tokens
    inputs, logical = dict(case.inputs), dict(case.logical)
    x = inputs["x"].clone()
    x[0, ::7] = nan
    x[min(1, s - 1), ::5] = inf
    x[min(1, s - 1), 3] = -inf
    inputs["x"] = x
    if everything:
        for k in ("qn_w", "kvn_w"):
            g = inputs[k].clone()
            g[3], g[4], g[-3] = nan, inf, -inf  # -3: a RoPE dim of kv
            inputs[k] = g
        cs = inputs["cos_sin"].clone()
        cs[int(inputs["pos"][0])] = inf
        inputs["cos_sin"] = cs
        for w, sc in (("wqkv", "wqkv_s"), ("wqb", "wqb_s")):
            wt = logical[w].clone()
            wt[7, 11] = torch.tensor(nan).to(wt.dtype)
            logical[w] = wt
            codes = logical[sc].clone()
            codes[1, 2] = 255
            logical[sc] = codes
    return dataclasses.replace(case, inputs=inputs, logical=logical)


def record_bytes(case: dc.Case, tokens) -> torch.Tensor:
    """A mask of the SWA bytes the records of ``tokens`` occupy (data and scale rows)."""
    from codegen.reference import deepseek_v41 as ref

    mask = torch.zeros(case.inputs["swa"].numel(), dtype=torch.bool)
    for t in tokens:
        sl = int(case.inputs["slot"][t])
        if sl < 0:
            continue
        base, off = (sl // case.swa_block) * case.swa_stride, sl % case.swa_block
        mask[base + off * ref.RECORD_DATA: base + (off + 1) * ref.RECORD_DATA] = True
        scale = base + case.swa_block * ref.RECORD_DATA + off * ref.RECORD_SCALE
        mask[scale: scale + ref.RECORD_SCALE] = True
    return mask


@pytest.mark.parametrize("everything", (False, True), ids=["x-rows", "everything"])
@pytest.mark.parametrize("tokens", (1, 6, 17))
def test_deepseek_nan_inf_inputs_finish_and_write_only_outputs(tokens, everything):
    kernel = codegen.load(DS_SPEC, tokens=tokens)
    clean = dc.make_case(tokens, 4, 1, kernel.target.name, seed=900 + tokens, pad_rows=(3,))
    case = ds_poison(clean, everything)
    args = dc.launch_args(case, kernel.workspace("cuda"))
    launch_twice_between_canaries(kernel, args)

    # what clean inputs give: the key table (integers only) always; with only x's rows 0 and 1
    # poisoned, q and the SWA records of the other rows too (rows are independent: the GEMVs'
    # token columns, the per-token norms)
    ref_args = dc.launch_args(clean, kernel.workspace("cuda"))
    kernel(**ref_args)
    finish(30.0)
    assert torch.equal(args["kt"].cpu(), ref_args["kt"].cpu()) and torch.equal(args["klen"].cpu(), ref_args["klen"].cpu())
    if not everything and tokens > 2:
        q, q_ref = args["q"].cpu().view(torch.int16), ref_args["q"].cpu().view(torch.int16)
        assert torch.equal(q[2:], q_ref[2:]), "q of the clean rows"
        keep = ~record_bytes(clean, (0, 1))
        assert torch.equal(args["swa"].cpu()[keep], ref_args["swa"].cpu()[keep]), "SWA bytes outside rows 0, 1's records"


def test_deepseek_misaligned_and_wrong_device_arguments():
    """Each DeepSeek tensor argument moved off its 16-byte alignment (by one
    element) is refused by name; so is a tensor on another GPU (where there is one)."""
    from codegen.launch import ArgumentError

    kernel, case, args = ds_setup(3, seed=5)
    kernel.pack(args)  # all good
    for a in kernel.ir.abi:
        t = args.get(a.name)
        if not a.is_tensor or t is None:
            continue
        size = t.element_size()
        raw = torch.empty(t.numel() * size + 16, dtype=torch.uint8, device="cuda")
        moved = raw[size: size + t.numel() * size].view(t.dtype).view(t.shape)
        assert moved.is_contiguous() and moved.data_ptr() % 16
        with pytest.raises(ArgumentError, match=rf"argument '{a.name}': expected a 16-byte aligned address"):
            kernel.pack(dict(args, **{a.name: moved}))
    if torch.cuda.device_count() > 1:
        other = args["x"].to("cuda:1")
        with pytest.raises(ArgumentError, match=r"argument 'x': expected device cuda:0"):
            kernel.pack(dict(args, x=other))
