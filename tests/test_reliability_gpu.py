"""Reliability on the GPU (the lent H200): hangs become errors in debug builds,
10,000 graph replays without clearing anything, NaN / Inf inputs.

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
    assert got[True][2] == got[False][2] == [1, 0]
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
    broken = Kernel(kernel.ir, kernel.source.replace(call, ""), kernel.backend, kernel.cooperative)
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
    assert ws["step"].cpu().tolist() == [1, 0], "the launch ran to its end"

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
    broken = Kernel(kernel.ir, kernel.source.replace(f"    stage_{norm.name}::run(a, mb, lds);\n", ""),
                    kernel.backend, kernel.cooperative)
    broken.compile()
    ws = broken.workspace("cuda")
    args = launch_args(make_inputs(tokens, kernel.target.name, seed=12), ws)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        broken(**args)
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

    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(100):
            kernel(**args)
    finish()
    before = ws["step"][0].item()
    t0 = time.perf_counter()
    for _ in range(100):
        graph.replay()
    took = finish(120.0)
    print(f"10,000 launches of S={tokens}: {took * 1e2:.1f} us each (replay loop {time.perf_counter() - t0:.2f} s)")
    assert ws["step"].cpu().tolist() == [before + 10_000, 0], "the epoch advances once per launch, on the device"

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
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)

    # scratch: canaries after its end; every other tensor: canaries on both sides
    scratch_buf = torch.full((ws["scratch"].numel() + PAD,), CANARY, dtype=torch.uint8, device="cuda")
    scratch_buf[: ws["scratch"].numel()] = 0
    args[kernel.ir.scratch_arg] = scratch_buf[: ws["scratch"].numel()]
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
    assert args[kernel.ir.counter_arg].cpu().tolist() == [2, 0]

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
