"""Kernels as torch custom ops, on the CPU: the schema follows the ABI (mutated
arguments, optional tensors, scalars), calling with CPU tensors reaches the
launcher's ArgumentError, and an op of this form traces under
``torch.compile(fullgraph=True)`` (with a CPU stand-in for the launch)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import codegen
from codegen import ops
from codegen.inputs import random_args
from codegen.launch import ArgumentError

SPEC = "minimax_m3/pre_attn"


@pytest.fixture(scope="module")
def kernel():
    return codegen.load(SPEC, tokens=4, target="sm90")  # compiles only at the first launch


def test_schema_follows_the_abi(kernel):
    op = ops.register(kernel)
    assert ops.op_name(kernel) == "mono::minimax_m3_pre_attn_s4_sm90"
    schema = torch.ops.mono.minimax_m3_pre_attn_s4_sm90.default._schema
    args = {a.name: a for a in schema.arguments}
    assert list(args) == [a.name for a in kernel.ir.abi], "ABI order"
    written = {n for n, a in args.items() if a.alias_info is not None and a.alias_info.is_write}
    want = {a.name for a in kernel.ir.abi if a.is_tensor and a.intent in ("out", "inout") and not a.optional}
    assert written == want and {"h_out", "scratch", "step"} <= written
    assert "tl" not in written, "torch cannot bump the version of a None argument: optional outputs are untracked"
    assert "ar" not in written and "w_qkv" not in written
    assert str(args["tl"].type) == "Optional[Tensor]"
    assert str(args["layer"].type) in ("int", "SymInt")
    assert len(schema.returns) == 0
    assert ops.register(kernel) is op, "one op per build"


def test_one_op_per_build():
    a = ops.load_op(SPEC, tokens=1, target="sm90")
    b = ops.load_op(SPEC, tokens=1, target="sm90", timeline=True)
    assert a is not b
    assert ops.op_name(codegen.load(SPEC, tokens=1, target="sm90", timeline=True)).endswith("_s1_timeline_sm90")


def test_cpu_tensors_raise_the_launchers_error(kernel):
    op = ops.register(kernel)
    args = random_args(kernel, seed=1, device="cpu")
    with pytest.raises(ArgumentError, match="'ar'.*on the GPU.*cpu"):
        op(**args)
    with pytest.raises(ArgumentError, match="'ar'.*on the GPU"):
        op(*[args[a.name] for a in kernel.ir.abi])  # positionally, in ABI order


class StandIn:
    """Shaped like a Kernel (``ir.abi``, ``kernel(**tensors)``), launching on the
    CPU: out = 2 * x + layer (the optional stamps are not written here)."""

    ir = SimpleNamespace(
        kernel="test/stand_in", name="stand_in",
        abi=(
            SimpleNamespace(name="x", dtype="f32", shape=(4,), intent="in", optional=False, is_tensor=True),
            SimpleNamespace(name="out", dtype="f32", shape=(4,), intent="out", optional=False, is_tensor=True),
            SimpleNamespace(name="layer", dtype="i32", shape=None, intent="in", optional=False, is_tensor=False),
            SimpleNamespace(name="tl", dtype="i64", shape=(2,), intent="out", optional=True, is_tensor=True),
        ),
    )

    def __call__(self, x, out, layer, tl=None):
        out.copy_(x * 2 + layer)


def test_compiles_fullgraph(monkeypatch):
    """The op form (a mutated arg, an optional tensor, an int scalar, no
    return) traces into one graph and writes through to the caller's tensors."""
    monkeypatch.setattr(ops, "op_name", lambda kernel: "mono::test_stand_in")
    op = ops.register(StandIn())
    schema = str(torch.ops.mono.test_stand_in.default._schema)
    assert "Tensor(a1!) out" in schema and "Tensor? tl)" in schema, schema

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x, out, tl, layer):
        op(x, out, layer, tl)

    x, out, tl = torch.arange(4.0), torch.zeros(4), torch.zeros(2, dtype=torch.int64)
    f(x, out, tl, 3)
    assert out.tolist() == [3.0, 5.0, 7.0, 9.0] and tl.tolist() == [0, 0]
    out.zero_()
    f(x, out, None, 1)
    assert out.tolist() == [1.0, 3.0, 5.0, 7.0]


def test_real_schema_compiles_with_aliased_caches(kernel, monkeypatch):
    """The pre_attn op itself under torch.compile(fullgraph=True), its launch
    replaced by a CPU stand-in: what the launch writes reaches the caller's
    tensors, also through K and V cache views of one allocation (the
    kv_page_stride=16 layout: V starts 8 pages into the K block)."""
    from codegen.launch import Kernel

    def launch(self, **t):
        t["h_out"].fill_(1.5)
        t["k_cache"].view(torch.uint8)[0, :4] = 1
        t["v_cache"].view(torch.uint8)[0, :4] = 2  # = K page 8
        t["step"][0] += 1

    monkeypatch.setattr(Kernel, "__call__", launch)
    op = ops.register(kernel)
    args = random_args(kernel, seed=2, device="cpu")
    page = kernel.ir.arg("k_cache").shape[1]
    block = torch.zeros(16 * page, dtype=torch.uint8)
    fp8 = args["k_cache"].dtype
    args["k_cache"], args["v_cache"] = block.view(16, page).view(fp8), block[8 * page:].view(8, page).view(fp8)
    names = [a.name for a in kernel.ir.abi]

    @torch.compile(fullgraph=True, backend="aot_eager")
    def decode_step(xs):
        op(*xs)

    decode_step([args[n] for n in names])
    assert (args["h_out"].float() == 1.5).all() and args["step"].tolist() == [1, 0]
    assert block.view(16, page)[0, :5].tolist() == [1, 1, 1, 1, 0]
    assert block.view(16, page)[8, :5].tolist() == [2, 2, 2, 2, 0]
    decode_step([args[n] for n in names])
    assert args["step"].tolist() == [2, 0]


# ---- DeepSeek-V4.1 attn_front ---------------------------------------------------------------

DS_SPEC = "deepseek_v41/attn_front"


@pytest.fixture(scope="module")
def ds_kernel():
    return codegen.load(DS_SPEC, tokens=4, target="sm90", index=True)  # index: qr_out is written


def test_deepseek_schema_follows_the_abi(ds_kernel):
    op = ops.register(ds_kernel)
    assert ops.op_name(ds_kernel) == "mono::deepseek_v41_attn_front_s4_index_sm90"
    schema = torch.ops.mono.deepseek_v41_attn_front_s4_index_sm90.default._schema
    args = {a.name: a for a in schema.arguments}
    assert list(args) == [a.name for a in ds_kernel.ir.abi], "ABI order"
    written = {n for n, a in args.items() if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"swa", "q", "kt", "klen", "scratch", "epoch"} == set(ops.mutated(ds_kernel))
    # optional outputs are untracked (see ops.mutated): qr_out is written into the caller's tensor
    assert "qr_out" not in written and "tl" not in written
    for name in ("qr_out", "tl"):
        assert str(args[name].type) == "Optional[Tensor]", name
    for name in ("x", "wqkv", "wqkv_s", "wqb", "wqb_s", "cos_sin", "pos", "slot", "topk", "comp_bt"):
        assert str(args[name].type) == "Tensor" and name not in written, name
    for name in ("x_stride", "swa_stride", "swa_block", "comp_block", "bt_stride", "layer"):
        assert str(args[name].type) in ("int", "SymInt"), name  # i64 swa_stride included
    assert len(schema.returns) == 0
    assert ops.register(ds_kernel) is op, "one op per build"


def test_deepseek_one_op_per_build():
    names = {ops.op_name(codegen.load(DS_SPEC, target="sm90", **flags)) for flags in (
        dict(tokens=4), dict(tokens=4, tp=2), dict(tokens=4, ratio=0), dict(tokens=4, tuned=True),
        dict(tokens=4, debug=True), dict(tokens=17))}
    assert len(names) == 6
    assert "mono::deepseek_v41_attn_front_s4_tp2_sm90" in names and "mono::deepseek_v41_attn_front_s4_debug_sm90" in names


def test_deepseek_cpu_tensors_raise_the_launchers_error(ds_kernel):
    op = ops.register(ds_kernel)
    args = random_args(ds_kernel, seed=1, device="cpu")
    assert args["qr_out"] is None and args["tl"] is None  # optional: None
    with pytest.raises(ArgumentError, match="'x'.*on the GPU.*cpu"):
        op(**args)
    with pytest.raises(ArgumentError, match="'x'.*on the GPU"):
        op(*[args[a.name] for a in ds_kernel.ir.abi])  # positionally, in ABI order
    with pytest.raises(ArgumentError, match="'wqkv'.*expected dtype"):
        op(**dict(args, wqkv=args["wqkv"].view(torch.uint8)))  # shape before device


def test_deepseek_real_schema_compiles(ds_kernel, monkeypatch):
    """The attn_front op under torch.compile(fullgraph=True), its launch
    replaced by a CPU stand-in: what the launch writes reaches the caller's
    tensors (q, the key table, SWA bytes through a view of a larger cache
    buffer, the epoch; qr_out when given, untouched as None)."""
    from codegen.launch import Kernel

    def launch(self, **t):
        t["q"].fill_(2.5)
        t["kt"].fill_(7)
        t["klen"].fill_(3)
        t["swa"][:4] = 9
        t["epoch"][0] += 1
        if t["qr_out"] is not None:
            t["qr_out"].fill_(-1.0)

    monkeypatch.setattr(Kernel, "__call__", launch)
    op = ops.register(ds_kernel)
    args = random_args(ds_kernel, seed=2, device="cpu", dims={"swa_bytes": 64})
    cache = torch.zeros(128, dtype=torch.uint8)
    args["swa"] = cache[64:]  # the SWA blocks live in a larger allocation
    names = [a.name for a in ds_kernel.ir.abi]

    @torch.compile(fullgraph=True, backend="aot_eager")
    def decode_step(xs):
        op(*xs)

    decode_step([args[n] for n in names])
    assert (args["q"].float() == 2.5).all() and (args["kt"] == 7).all() and (args["klen"] == 3).all()
    assert cache[60:70].tolist() == [0, 0, 0, 0, 9, 9, 9, 9, 0, 0] and args["epoch"].tolist() == [1, 0]
    qr = torch.zeros(4, ds_kernel.ir.arg("qr_out").shape[1], dtype=torch.bfloat16)
    args["qr_out"] = qr
    decode_step([args[n] for n in names])
    assert args["epoch"].tolist() == [2, 0] and (qr.float() == -1.0).all()
