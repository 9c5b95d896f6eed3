"""The launcher's argument checks, on the CPU (no GPU is needed until launch).

``kernel.pack(...)`` checks, for every argument in ABI order, its type, dtype,
shape and layout first, then, for all of them, device and alignment: each
refusal is an ``ArgumentError`` naming the argument, what was expected and
what was given. Arguments are made from the ABI itself, so these tests follow
the spec as it grows."""

from __future__ import annotations

import pytest
import torch

import codegen
from codegen.launch import ArgumentError, torch_dtype

RUNTIME = 4  # the size given to every runtime dimension (cache pages, table columns, ...)


@pytest.fixture(scope="module")
def kernel():
    return codegen.launch.load("minimax_m3/pre_attn", tokens=2, target="sm90")


def shape_of(a) -> tuple[int, ...]:
    return tuple(RUNTIME if isinstance(d, str) else d for d in a.shape)


def good_args(kernel) -> dict:
    """A value of the right kind for every ABI argument (tensors on the CPU)."""
    out = {}
    for a in kernel.ir.abi:
        if a.is_tensor:
            out[a.name] = torch.zeros(shape_of(a), dtype=torch_dtype(a.dtype, kernel.target))
        elif a.dtype == "f32":
            out[a.name] = 1.0
        else:
            out[a.name] = a.range[0] if a.range else 1
    return out


TENSORS = [a.name for a in codegen.launch.load("minimax_m3/pre_attn", tokens=2, target="sm90").ir.abi if a.is_tensor]
SCALARS = [a for a in codegen.launch.load("minimax_m3/pre_attn", tokens=2, target="sm90").ir.abi if not a.is_tensor]


def refuse(kernel, args, *fragments):
    with pytest.raises(ArgumentError) as e:
        kernel.pack(args)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def test_good_arguments_reach_the_device_check(kernel):
    """Types, dtypes and shapes all pass: the first refusal is the first
    tensor's device (CPU, not the GPU)."""
    first = TENSORS[0]
    refuse(kernel, good_args(kernel), f"argument {first!r}", "expected a tensor on the GPU, got device cpu")


@pytest.mark.parametrize("name", TENSORS)
def test_wrong_dtype(kernel, name):
    args = good_args(kernel)
    have = args[name].dtype
    wrong = torch.float16 if have != torch.float16 else torch.float32
    args[name] = torch.zeros(args[name].shape, dtype=wrong)
    refuse(kernel, args, f"argument {name!r}", f"expected dtype {have}", f"got {wrong}")


@pytest.mark.parametrize("name", TENSORS)
def test_wrong_shape(kernel, name):
    """One fixed dimension one larger (a runtime dimension may take any size)."""
    args = good_args(kernel)
    a = kernel.ir.arg(name)
    j = next(j for j, d in enumerate(a.shape) if isinstance(d, int))
    bad = list(args[name].shape)
    bad[j] += 1
    args[name] = torch.zeros(bad, dtype=args[name].dtype)
    refuse(kernel, args, f"argument {name!r}", f"expected shape {a.shape_text}", f"got {bad}")


def test_runtime_dimension_disagrees(kernel):
    """A runtime dimension is one size in every argument that uses it."""
    users: dict[str, list[str]] = {}
    for a in kernel.ir.abi:
        for d in a.shape or ():
            if isinstance(d, str):
                users.setdefault(d, []).append(a.name)
    dim, names = next((d, n) for d, n in users.items() if len(n) > 1)
    args = good_args(kernel)
    later = kernel.ir.arg(names[1])
    bad = [RUNTIME + 1 if d == dim else s for d, s in zip(later.shape, args[later.name].shape)]
    args[later.name] = torch.zeros(bad, dtype=args[later.name].dtype)
    refuse(kernel, args, f"argument {later.name!r}", f"dimension {dim} = {RUNTIME + 1} disagrees with {names[0]!r}")


@pytest.mark.parametrize("name", TENSORS)
def test_wrong_rank(kernel, name):
    args = good_args(kernel)
    args[name] = args[name].reshape(-1, 1)
    refuse(kernel, args, f"argument {name!r}", "expected shape", f"got {list(args[name].shape)}")


@pytest.mark.parametrize("name", TENSORS)
def test_non_contiguous(kernel, name):
    args = good_args(kernel)
    t = args[name]
    wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
    args[name] = wide[..., ::2]  # the right shape and dtype, every other element
    assert args[name].shape == t.shape and not args[name].is_contiguous()
    refuse(kernel, args, f"argument {name!r}", "expected a contiguous tensor", "got strides")


@pytest.mark.parametrize("a", SCALARS, ids=lambda a: a.name)
def test_scalar_out_of_range(kernel, a):
    lo, hi = a.range if a.range else ((-(2**31), 2**31 - 1) if a.dtype == "i32" else (-(2**63), 2**63 - 1))
    for value in (lo - 1, hi + 1):
        args = dict(good_args(kernel), **{a.name: value})
        refuse(kernel, args, f"argument {a.name!r}", f"expected a value in [{lo}, {hi}]", f"got {value}")


@pytest.mark.parametrize("a", [a for a in SCALARS if a.dtype != "f32"], ids=lambda a: a.name)
@pytest.mark.parametrize("value", [1.5, "3", True, None, torch.tensor(3)], ids=["float", "str", "bool", "none", "tensor"])
def test_scalar_wrong_type(kernel, a, value):
    args = dict(good_args(kernel), **{a.name: value})
    refuse(kernel, args, f"argument {a.name!r}", f"expected an int ({a.dtype})", f"got {type(value).__name__}")


@pytest.mark.parametrize("name", TENSORS)
def test_tensor_argument_given_a_number(kernel, name):
    args = dict(good_args(kernel), **{name: 3})
    refuse(kernel, args, f"argument {name!r}", "expected a torch.Tensor, got int")


def test_unknown_argument(kernel):
    refuse(kernel, dict(good_args(kernel), bogus=1, h_in=2), "unknown argument(s) bogus, h_in", "the ABI is")


def test_missing_arguments(kernel):
    args = good_args(kernel)
    del args[TENSORS[0]], args[SCALARS[0].name]
    refuse(kernel, args, "missing argument(s)", TENSORS[0], SCALARS[0].name)


def test_optional_argument_may_be_none_or_absent(kernel):
    optional = [a.name for a in kernel.ir.abi if a.optional]
    assert optional, "the spec has an optional argument (tl)"
    for how in ("none", "absent"):
        args = good_args(kernel)
        for n in optional:
            if how == "none":
                args[n] = None
            else:
                del args[n]
        refuse(kernel, args, "expected a tensor on the GPU")  # got past every optional argument


def test_tokens_over_the_build_maximum():
    with pytest.raises(ValueError, match=r"tokens=17 is not allowed; values: 1\.\.16"):
        codegen.launch.load("minimax_m3/pre_attn", tokens=17, target="sm90")
    with pytest.raises(ValueError, match=r"tokens=0 is not allowed"):
        codegen.launch.load("minimax_m3/pre_attn", tokens=0, target="sm90")


def test_tensor_of_another_build(kernel):
    """Arguments shaped for tokens=3 into the tokens=2 kernel: the first
    token-shaped argument is refused by shape."""
    other = codegen.launch.load("minimax_m3/pre_attn", tokens=3, target="sm90")
    first = next(a for a in kernel.ir.abi if a.is_tensor and a.shape != other.ir.arg(a.name).shape)
    refuse(kernel, good_args(other), f"argument {first.name!r}", "expected shape")
