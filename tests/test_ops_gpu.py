"""The MiniMax-M3 pre_attn kernel (and, below, the DeepSeek-V4.1 attn_front)
as a torch custom op on the GPU: under ``torch.compile(fullgraph=True)`` it
writes what a direct launch writes (h_out, the qkv mailbox, every output and
cache byte; DeepSeek: q, the key table, the SWA cache, qr_out, the mailboxes),
inside CUDA graph capture it replays like the kernel itself, and a compiled
caller can be captured too (how serving engines run decode steps)."""

from __future__ import annotations

import pytest
import torch

import codegen
from codegen import ops
from tests.graphs import capture
from tests import deepseek_case as dc
from tests.minimax_case import expected_tag, launch_args, make_inputs, read_mailbox

pytestmark = pytest.mark.gpu

SPEC = "minimax_m3/pre_attn"


def written(kernel, args: dict) -> dict:
    """Bytes of every out/inout ABI tensor other than the workspace, and of the qkv region."""
    out = {a.name: args[a.name].cpu().contiguous().view(torch.uint8).clone()
           for a in kernel.ir.abi if a.is_tensor and a.intent != "in" and a.workspace is None}
    r = kernel.ir.region("qkv")
    out["scratch.qkv"] = args["scratch"][r.offset: r.offset + r.nbytes].cpu().clone()
    return out


def case(tokens: int, seed: int, **flags):
    kernel = codegen.load(SPEC, tokens=tokens, **flags)
    inp = make_inputs(tokens, kernel.target.name, seed, kv_page_stride=flags.get("kv_page_stride", 16))
    return kernel, inp


@pytest.mark.parametrize("kv_page_stride", (16, 8))  # 16: the K and V views share one allocation
def test_op_under_torch_compile(kv_page_stride):
    tokens = 4
    kernel, inp = case(tokens, seed=11, kv_page_stride=kv_page_stride)
    op = ops.register(kernel)
    names = [a.name for a in kernel.ir.abi]

    direct = launch_args(inp, kernel.workspace("cuda"))
    kernel(**direct)
    torch.cuda.synchronize()
    want = written(kernel, direct)

    @torch.compile(fullgraph=True)
    def decode_step(xs):
        op(*xs)

    args = launch_args(inp, kernel.workspace("cuda"))
    decode_step([args[n] for n in names])
    torch.cuda.synchronize()
    got = written(kernel, args)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs from the direct launch"
    assert args["step"].cpu().tolist() == kernel.ir.advanced([0, 0]), "the op advanced the counter once"

    decode_step([args[n] for n in names])  # the compiled code again: the next epoch, same values
    torch.cuda.synchronize()
    mb = read_mailbox(kernel, args["scratch"], tokens)
    assert args["step"].cpu().tolist() == kernel.ir.advanced([0, 0], 2)
    assert (mb["qkv_tag"] == expected_tag(1)).all()
    assert torch.equal(mb["qkv"], read_mailbox(kernel, direct["scratch"], tokens)["qkv"])


@pytest.mark.parametrize("tokens", (1, 16))
def test_op_in_cuda_graph(tokens):
    kernel, inp = case(tokens, seed=21)
    op = ops.register(kernel)
    args = launch_args(inp, kernel.workspace("cuda"))
    op(**args)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    single = read_mailbox(kernel, args["scratch"], tokens)
    h_single = args["h_out"].clone()

    graph = capture(lambda: op(**args))
    torch.cuda.synchronize()
    before = kernel.ir.epoch(args["step"].cpu())
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    assert kernel.ir.epoch(args["step"].cpu()) == before + 10
    got = read_mailbox(kernel, args["scratch"], tokens)
    assert torch.equal(got["qkv"], single["qkv"])
    assert (got["qkv_tag"] == expected_tag(before + 9)).all()
    assert torch.equal(args["h_out"], h_single)


def test_compiled_caller_in_cuda_graph():
    """torch.compile first, then capture the compiled function: the pattern of
    engines that compile the model and replay decode steps from graphs."""
    tokens = 4
    kernel, inp = case(tokens, seed=31)
    op = ops.register(kernel)
    names = [a.name for a in kernel.ir.abi]
    args = launch_args(inp, kernel.workspace("cuda"))
    xs = [args[n] for n in names]

    @torch.compile(fullgraph=True)
    def decode_step(xs):
        op(*xs)

    decode_step(xs)  # compile outside the capture
    torch.cuda.synchronize()
    single = read_mailbox(kernel, args["scratch"], tokens)

    graph = capture(lambda: decode_step(xs), warm=True)  # warm the compiled code on the capture stream
    torch.cuda.synchronize()
    before = kernel.ir.epoch(args["step"].cpu())
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    assert kernel.ir.epoch(args["step"].cpu()) == before + 5
    got = read_mailbox(kernel, args["scratch"], tokens)
    assert torch.equal(got["qkv"], single["qkv"])
    assert (got["qkv_tag"] == expected_tag(before + 4)).all()


# ---- DeepSeek-V4.1 attn_front ------------------------------------------------------------------

DS_SPEC = "deepseek_v41/attn_front"


def ds_written(kernel, args: dict) -> dict:
    """Bytes of every out/inout ABI tensor given (q, kt, klen, the SWA cache,
    qr_out) and of the values in the partials and QX8 mailboxes (not their tags, which
    change with the epoch: dc.check checks them)."""
    out = {a.name: args[a.name].cpu().contiguous().view(torch.uint8).clone()
           for a in kernel.ir.abi if a.is_tensor and a.intent != "in" and a.workspace is None
           and args.get(a.name) is not None}
    mailboxes = dc.read_scratch(kernel.ir, args["scratch"], args["q"].shape[0])
    for name in ("partials", "qx8", "qx8s"):
        out[f"scratch.{name}"] = mailboxes[name].contiguous().view(torch.uint8)
    return out


def ds_case(tokens: int, seed: int, **flags):
    kernel = codegen.load(DS_SPEC, tokens=tokens, **flags)
    tp = dict(kernel.ir.build.params)["tp"]
    case = dc.make_case(tokens, tp, 1, kernel.target.name, seed=seed, swa_block=64, pad_rows=(1,))
    return kernel, case


@pytest.mark.parametrize("tokens,flags", [(6, {}), (17, {"index": True}), (48, {"tuned": True, "tp": 2})],
                         ids=["s6", "s17-index", "s48-tuned-tp2"])
def test_deepseek_op_under_torch_compile(tokens, flags):
    """The op in a compiled decode step writes what a direct launch writes
    (index builds: qr_out too, an optional output the caller passes)."""
    kernel, case = ds_case(tokens, seed=11 + tokens, **flags)
    op = ops.register(kernel)
    names = [a.name for a in kernel.ir.abi]

    direct = dc.launch_args(case, kernel.workspace("cuda"))
    kernel(**direct)
    torch.cuda.synchronize()
    dc.check(case, kernel.ir, direct, epoch=0)
    want = ds_written(kernel, direct)

    @torch.compile(fullgraph=True)
    def decode_step(xs):
        op(*xs)

    args = dc.launch_args(case, kernel.workspace("cuda"))
    decode_step([args[n] for n in names])
    torch.cuda.synchronize()
    got = ds_written(kernel, args)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs from the direct launch"
    assert args["epoch"].cpu().tolist() == kernel.ir.advanced([0, 0]), "the op advanced the counter once"

    decode_step([args[n] for n in names])  # the compiled code again: the next epoch, same values
    torch.cuda.synchronize()
    assert args["epoch"].cpu().tolist() == kernel.ir.advanced([0, 0], 2)
    dc.check(case, kernel.ir, args, epoch=1)
    assert torch.equal(ds_written(kernel, args)["q"], want["q"])


@pytest.mark.parametrize("tokens", (1, 17))
def test_deepseek_op_in_cuda_graph(tokens):
    kernel, case = ds_case(tokens, seed=21)
    op = ops.register(kernel)
    args = dc.launch_args(case, kernel.workspace("cuda"))
    op(**args)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    single = ds_written(kernel, args)

    graph = capture(lambda: op(**args))
    torch.cuda.synchronize()
    before = kernel.ir.epoch(args["epoch"].cpu())
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    assert kernel.ir.epoch(args["epoch"].cpu()) == before + 10
    dc.check(case, kernel.ir, args, epoch=before + 9)
    got = ds_written(kernel, args)
    for name in ("q", "kt", "klen", "swa", "scratch.qx8", "scratch.qx8s"):
        assert torch.equal(got[name], single[name]), name


def test_deepseek_compiled_caller_in_cuda_graph():
    """torch.compile first, then capture the compiled function (how engines
    replay decode steps), for the DeepSeek front."""
    kernel, case = ds_case(6, seed=31)
    op = ops.register(kernel)
    names = [a.name for a in kernel.ir.abi]
    args = dc.launch_args(case, kernel.workspace("cuda"))
    xs = [args[n] for n in names]

    @torch.compile(fullgraph=True)
    def decode_step(xs):
        op(*xs)

    decode_step(xs)  # compile outside the capture
    torch.cuda.synchronize()
    q_single = args["q"].clone()

    graph = capture(lambda: decode_step(xs), warm=True)  # warm the compiled code on the capture stream
    torch.cuda.synchronize()
    before = kernel.ir.epoch(args["epoch"].cpu())
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    assert kernel.ir.epoch(args["epoch"].cpu()) == before + 5
    assert torch.equal(args["q"].view(torch.int16), q_single.view(torch.int16))
    dc.check(case, kernel.ir, args, epoch=before + 4)
