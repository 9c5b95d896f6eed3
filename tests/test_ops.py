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
