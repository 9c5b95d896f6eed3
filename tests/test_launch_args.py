"""The launcher's argument checks, on the CPU (no GPU is needed until launch).

``kernel.pack(...)`` checks, for every argument in ABI order, its type, dtype,
shape and layout first, then, for all of them, device and alignment: each
refusal is an ``ArgumentError`` naming the argument, what was expected and
what was given. Arguments are made from the ABI itself, so these tests follow
the specs as they grow: every test runs for each spec's ABI (MiniMax-M3
pre_attn; DeepSeek-V4.1 attn_front with its i64 scalars, runtime-sized caches
and tables, and an optional output). Device and alignment refusals need a GPU:
tests/test_reliability_gpu.py."""

from __future__ import annotations

import time
import types
from dataclasses import replace

import pytest
import torch

import codegen
from codegen.jit._launch import KernelParams
from codegen.launch import PREPARED_LAUNCHES, ArgumentError, DeviceError, torch_dtype
from scripts.host_launch_time import place_at_address, stub_gpu

RUNTIME = 4  # the size given to every runtime dimension (cache pages, table columns, ...)
# spec -> (short id, the build under test, another build whose arguments differ in shape)
SPECS = {
    "minimax_m3/pre_attn": ("minimax", dict(tokens=2), dict(tokens=3)),
    "deepseek_v41/attn_front": ("deepseek", dict(tokens=3), dict(tokens=3, tp=2)),
}


def load(spec: str, **flags):
    return codegen.launch.load(spec, target="sm90", **(flags or SPECS[spec][1]))


KERNELS = {spec: load(spec) for spec in SPECS}  # lowered and rendered; compiled only at a launch


def abi_cases(keep) -> list:
    """(spec, ABI argument) for every argument of every spec that ``keep`` selects."""
    return [pytest.param(spec, a, id=f"{short}-{a.name}")
            for spec, (short, _, _) in SPECS.items() for a in KERNELS[spec].ir.abi if keep(a)]


TENSORS = abi_cases(lambda a: a.is_tensor)
SCALARS = abi_cases(lambda a: not a.is_tensor)
SPEC_IDS = [pytest.param(spec, id=short) for spec, (short, _, _) in SPECS.items()]


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


def refuse(kernel, args, *fragments):
    with pytest.raises(ArgumentError) as e:
        kernel.pack(args)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def test_every_abi_is_covered():
    """Both specs' tensors and scalars are under test, DeepSeek's i64 scalar and
    runtime-sized arguments among them."""
    names = {(p.values[0], p.values[1].name) for p in TENSORS + SCALARS}
    for spec, kernel in KERNELS.items():
        assert {(spec, a.name) for a in kernel.ir.abi} <= names
    ds = KERNELS["deepseek_v41/attn_front"].ir
    assert ds.arg("swa_stride").dtype == "i64" and ds.arg("swa").shape == ("swa_bytes",)
    assert ds.arg("qr_out").optional and ds.arg("comp_bt").shape == ("comp_reqs", "comp_cols")


@pytest.mark.parametrize("spec", SPEC_IDS)
def test_good_arguments_reach_the_device_check(spec):
    """Types, dtypes and shapes all pass: the first refusal is the first
    tensor's device (CPU, not the GPU)."""
    kernel = KERNELS[spec]
    first = next(a.name for a in kernel.ir.abi if a.is_tensor)
    refuse(kernel, good_args(kernel), f"argument {first!r}", "expected a tensor on the GPU, got device cpu")


@pytest.mark.parametrize("spec,a", TENSORS)
def test_wrong_dtype(spec, a):
    kernel = KERNELS[spec]
    args = good_args(kernel)
    have = args[a.name].dtype
    wrong = torch.float16 if have != torch.float16 else torch.float32
    args[a.name] = torch.zeros(args[a.name].shape, dtype=wrong)
    refuse(kernel, args, f"argument {a.name!r}", f"expected dtype {have}", f"got {wrong}")


@pytest.mark.parametrize("spec,a", abi_cases(lambda a: a.is_tensor and any(isinstance(d, int) for d in a.shape)))
def test_wrong_shape(spec, a):
    """One fixed dimension one larger (a runtime dimension may take any size)."""
    kernel = KERNELS[spec]
    args = good_args(kernel)
    j = next(j for j, d in enumerate(a.shape) if isinstance(d, int))
    bad = list(args[a.name].shape)
    bad[j] += 1
    args[a.name] = torch.zeros(bad, dtype=args[a.name].dtype)
    refuse(kernel, args, f"argument {a.name!r}", f"expected shape {a.shape_text}", f"got {bad}")


def shared_runtime_dims(kernel) -> dict[str, list[str]]:
    """Runtime dimensions used by more than one argument -> those arguments."""
    users: dict[str, list[str]] = {}
    for a in kernel.ir.abi:
        for d in a.shape or ():
            if isinstance(d, str):
                users.setdefault(d, []).append(a.name)
    return {d: n for d, n in users.items() if len(n) > 1}


@pytest.mark.parametrize("spec", [p for p in SPEC_IDS if shared_runtime_dims(KERNELS[p.values[0]])])
def test_runtime_dimension_disagrees(spec):
    """A runtime dimension is one size in every argument that uses it (the
    DeepSeek ABI shares none: each of its runtime dimensions has one user)."""
    kernel = KERNELS[spec]
    dim, names = next(iter(shared_runtime_dims(kernel).items()))
    args = good_args(kernel)
    later = kernel.ir.arg(names[1])
    bad = [RUNTIME + 1 if d == dim else s for d, s in zip(later.shape, args[later.name].shape)]
    args[later.name] = torch.zeros(bad, dtype=args[later.name].dtype)
    refuse(kernel, args, f"argument {later.name!r}", f"dimension {dim} = {RUNTIME + 1} disagrees with {names[0]!r}")


@pytest.mark.parametrize("spec,a", abi_cases(lambda a: a.is_tensor and any(isinstance(d, str) for d in a.shape)))
def test_runtime_dimension_empty(spec, a):
    """A runtime dimension of size 0 (an empty cache or table) is refused by
    name: the kernel indexes it from data."""
    kernel = KERNELS[spec]
    args = good_args(kernel)
    j = next(j for j, d in enumerate(a.shape) if isinstance(d, str))
    bad = list(args[a.name].shape)
    bad[j] = 0
    args[a.name] = torch.zeros(bad, dtype=args[a.name].dtype)
    refuse(kernel, args, f"argument {a.name!r}", f"runtime dimension {a.shape[j]} must be positive", "got 0")


@pytest.mark.parametrize("spec,a", TENSORS)
def test_wrong_rank(spec, a):
    """One dimension more (the elements all there: [16, 1] would pass as a
    [comp_reqs, comp_cols] table, so the rank itself is what is wrong)."""
    kernel = KERNELS[spec]
    args = good_args(kernel)
    args[a.name] = args[a.name].unsqueeze(0)
    refuse(kernel, args, f"argument {a.name!r}", "expected shape", f"got {list(args[a.name].shape)}")


@pytest.mark.parametrize("spec,a", TENSORS)
def test_non_contiguous(spec, a):
    kernel = KERNELS[spec]
    args = good_args(kernel)
    t = args[a.name]
    wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
    args[a.name] = wide[..., ::2]  # the right shape and dtype, every other element
    assert args[a.name].shape == t.shape and not args[a.name].is_contiguous()
    refuse(kernel, args, f"argument {a.name!r}", "expected a contiguous tensor", "got strides")


@pytest.mark.parametrize("spec,a", SCALARS)
def test_scalar_out_of_range(spec, a):
    kernel = KERNELS[spec]
    lo, hi = a.range if a.range else ((-(2**31), 2**31 - 1) if a.dtype == "i32" else (-(2**63), 2**63 - 1))
    for value in (lo - 1, hi + 1):
        args = dict(good_args(kernel), **{a.name: value})
        refuse(kernel, args, f"argument {a.name!r}", f"expected a value in [{lo}, {hi}]", f"got {value}")


@pytest.mark.parametrize("spec,a", abi_cases(lambda a: not a.is_tensor and a.dtype != "f32"))
@pytest.mark.parametrize("value", [1.5, "3", True, None, torch.tensor(3)], ids=["float", "str", "bool", "none", "tensor"])
def test_scalar_wrong_type(spec, a, value):
    kernel = KERNELS[spec]
    args = dict(good_args(kernel), **{a.name: value})
    refuse(kernel, args, f"argument {a.name!r}", f"expected an int ({a.dtype})", f"got {type(value).__name__}")


@pytest.mark.parametrize("spec,a", TENSORS)
def test_tensor_argument_given_a_number(spec, a):
    kernel = KERNELS[spec]
    args = dict(good_args(kernel), **{a.name: 3})
    refuse(kernel, args, f"argument {a.name!r}", "expected a torch.Tensor, got int")


@pytest.mark.parametrize("spec,a", abi_cases(lambda a: a.is_tensor and not a.optional))
def test_required_tensor_given_none(spec, a):
    kernel = KERNELS[spec]
    args = dict(good_args(kernel), **{a.name: None})
    refuse(kernel, args, f"argument {a.name!r}", "expected a tensor, got None")


@pytest.mark.parametrize("spec", SPEC_IDS)
def test_unknown_argument(spec):
    kernel = KERNELS[spec]
    refuse(kernel, dict(good_args(kernel), bogus=1, h_in=2), "unknown argument(s) bogus, h_in", "the ABI is")


@pytest.mark.parametrize("spec", SPEC_IDS)
def test_missing_arguments(spec):
    kernel = KERNELS[spec]
    args = good_args(kernel)
    tensor = next(a.name for a in kernel.ir.abi if a.is_tensor)
    scalar = next(a.name for a in kernel.ir.abi if not a.is_tensor)
    del args[tensor], args[scalar]
    refuse(kernel, args, "missing argument(s)", tensor, scalar)


@pytest.mark.parametrize("spec", SPEC_IDS)
def test_optional_argument_may_be_none_or_absent(spec):
    kernel = KERNELS[spec]
    optional = [a.name for a in kernel.ir.abi if a.optional]
    assert optional, "the spec has an optional argument (tl; DeepSeek: qr_out too)"
    for how in ("none", "absent"):
        args = good_args(kernel)
        for n in optional:
            if how == "none":
                args[n] = None
            else:
                del args[n]
        refuse(kernel, args, "expected a tensor on the GPU")  # got past every optional argument


@pytest.mark.parametrize("spec,values,message", [
    ("minimax_m3/pre_attn", dict(tokens=17), r"tokens=17 is not allowed; values: 1\.\.16"),
    ("minimax_m3/pre_attn", dict(tokens=0), r"tokens=0 is not allowed"),
    ("deepseek_v41/attn_front", dict(tokens=49), r"tokens=49 is not allowed; values: 1\.\.48"),
    ("deepseek_v41/attn_front", dict(tokens=0), r"tokens=0 is not allowed"),
    ("deepseek_v41/attn_front", dict(tokens=4, tp=8), r"tp=8 is not allowed; values: \[2, 4\]"),
    ("deepseek_v41/attn_front", dict(tokens=4, ratio=4), r"ratio=4 is not allowed; values: \[0, 1, 2\]"),
    ("deepseek_v41/attn_front", dict(tokens=4, index=1), r"build parameter index=1 must be of type bool"),
    ("deepseek_v41/attn_front", dict(tokens=4, eps=1e-6), r"unknown build parameter\(s\) eps"),
], ids=["minimax-tokens17", "minimax-tokens0", "deepseek-tokens49", "deepseek-tokens0", "deepseek-tp8",
        "deepseek-ratio4", "deepseek-index-int", "deepseek-unknown"])
def test_build_parameter_refused(spec, values, message):
    with pytest.raises(ValueError, match=message):
        codegen.launch.load(spec, target="sm90", **values)


@pytest.mark.parametrize("spec", SPEC_IDS)
def test_tensor_of_another_build(spec):
    """Arguments shaped for another build (MiniMax tokens=3 into tokens=2;
    DeepSeek tp=2 into tp=4: wq_b and q have twice the heads): the first
    argument whose shape differs is refused by shape."""
    kernel = KERNELS[spec]
    other = load(spec, **SPECS[spec][2])
    first = next(a for a in kernel.ir.abi if a.is_tensor and a.shape != other.ir.arg(a.name).shape)
    refuse(kernel, good_args(other), f"argument {first.name!r}", "expected shape")


class FakeFunction:
    """A compiled kernel's stand-in (no GPU here): its prepared launches pack the arguments as the
    real ones do (KernelParams), and each call records them."""

    def __init__(self):
        self.launches = []
        self.prepares = 0

    def prepare(self, grid, block, dyn_smem, args, cooperative=False, pdl=False):
        self.prepares += 1

        def launch(stream):
            self.launches.append(list(args))

        launch.params = KernelParams(args)  # the real packing: part of the host time compared
        return launch


@pytest.fixture
def host_launch(monkeypatch):
    """Launches on the CPU (scripts/host_launch_time.py's stub_gpu, undone after the test):
    tensors placed at their CPU addresses (the device check is tests/test_reliability_gpu.py's),
    the current stream 0 on cuda:0, the process's kernel device, and a fake compiled function."""
    fn = FakeFunction()
    stub_gpu(fn, monkeypatch.setattr)
    return fn


@pytest.mark.parametrize("spec", SPEC_IDS)
def test_bound_launch(spec, host_launch):
    """kernel.bind(**tensors) checks as kernel(**tensors) does, once; its calls launch with the
    same arguments a checked launch packs, and refuse by name a tensor whose storage moved since
    (rebind takes new tensors, checked again). A bound call takes a fraction of a checked
    launch's host time (the point of it)."""
    kernel = KERNELS[spec]
    args = good_args(kernel)
    a = next(a for a in kernel.ir.abi if a.is_tensor)
    with pytest.raises(ArgumentError, match=f"argument {a.name!r}: expected dtype"):
        kernel.bind(**{**args, a.name: args[a.name].view(torch.uint8) if args[a.name].element_size() > 1
                       else args[a.name].view(torch.int8)})
    bound = kernel.bind(**args)
    kernel(**args)
    bound()
    assert len(host_launch.launches) == 2 and host_launch.launches[0] == host_launch.launches[1]
    assert ("u64", args[a.name].data_ptr()) in host_launch.launches[1]
    args[a.name].set_(torch.zeros_like(args[a.name]))  # the same tensor, new storage
    with pytest.raises(ArgumentError, match=rf"argument {a.name!r}: its storage moved since bind\(\).*rebind"):
        bound()
    assert len(host_launch.launches) == 2
    bound.rebind(**{a.name: args[a.name]})()
    assert ("u64", args[a.name].data_ptr()) in host_launch.launches[2]

    def host_us(call, n=200):
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                call()
            best = min(best, (time.perf_counter() - t) / n * 1e6)
        return best

    bound = kernel.bind(**args)
    checked, fast = host_us(lambda: kernel(**args)), host_us(bound)
    assert fast < checked / 3, f"bound {fast:.1f} us against checked {checked:.1f} us a launch"


@pytest.mark.parametrize("spec", SPEC_IDS)
def test_checked_launch_reuses_its_prepared_launch(spec, host_launch):
    """A checked launch with the arguments of a recent one reuses that one's prepared launch
    (packing the driver's argument array is most of what is left of a launch's host time after
    the checks); another address prepares anew and launches with it; every call still checks
    every argument (a tensor made non-contiguous in place, at the same address, is refused); the
    oldest of more than PREPARED_LAUNCHES argument sets is dropped."""
    kernel = replace(KERNELS[spec])  # a Kernel of its own: no prepared launches yet
    args = good_args(kernel)
    a = next(a for a in kernel.ir.abi if a.is_tensor)
    kernel(**args)
    kernel(**args)
    assert host_launch.prepares == 1 and host_launch.launches[0] == host_launch.launches[1]
    moved = {**args, a.name: args[a.name].clone()}
    kernel(**moved)
    assert host_launch.prepares == 2 and ("u64", moved[a.name].data_ptr()) in host_launch.launches[2]
    kernel(**args)
    assert host_launch.prepares == 2 and host_launch.launches[3] == host_launch.launches[0]
    with pytest.raises(ArgumentError, match=f"argument {a.name!r}: expected shape"):
        kernel(**{**args, a.name: args[a.name].flatten()[:-1]})
    w = next(b for b in kernel.ir.abi if b.is_tensor and len(b.shape) == 2 and all(d > 1 for d in shape_of(b)))
    tensor = args[w.name]
    tensor.as_strided_(tensor.shape, (1, tensor.shape[0]))  # the same tensor and address, not contiguous now
    with pytest.raises(ArgumentError, match=f"argument {w.name!r}: expected a contiguous tensor"):
        kernel(**args)
    tensor.as_strided_(tensor.shape, (tensor.shape[1], 1))
    clones = [args[a.name].clone() for _ in range(PREPARED_LAUNCHES)]  # kept alive: addresses of their own
    for clone in clones:
        kernel(**{**args, a.name: clone})
    assert host_launch.prepares == 2 + PREPARED_LAUNCHES and len(kernel._prepared_launches) == PREPARED_LAUNCHES
    kernel(**args)  # its set was the oldest, and was dropped
    assert host_launch.prepares == 3 + PREPARED_LAUNCHES and host_launch.launches[-1] == host_launch.launches[0]


def test_current_stream_handle(monkeypatch):
    """A launch's stream is torch's current stream of the device, as the driver's handle: through
    torch's raw getter where torch has one (CUDA and ROCm builds), else the public
    ``current_stream(device).cuda_stream`` (this CPU build has no getter)."""
    from codegen.launch import _current_stream_handle

    asked = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: asked.append(device) or types.SimpleNamespace(cuda_stream=0x5000 + device))
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    assert _current_stream_handle(1) == 0x5001 and asked == [1]
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x7000 + device, raising=False)
    assert _current_stream_handle(2) == 0x7002 and asked == [1]


def test_kernels_run_on_one_gpu_a_process(monkeypatch):
    """The first compile makes torch's current device the process's kernel device (the CUDA
    backend's primary context, loaded once a process); a compile, a newly prepared launch or
    a bound launch with another device current is refused, naming both devices and the fix, for
    every kernel of the process; with it current again, they go on."""
    import codegen.jit
    from codegen.jit import cuda as jcuda

    launches = []

    class FakeModule:
        def function(self, name):
            return types.SimpleNamespace(set_max_dynamic_shared=lambda n: None, set_shared_carveout=lambda p: None,
                                         max_active_blocks_per_sm=lambda threads, lds: 1, attributes=dict,
                                         prepare=lambda *a, **k: launches.append)

    device = [1]
    monkeypatch.setattr(jcuda, "_primary", {})  # no context yet: the first compile makes it
    monkeypatch.setattr(jcuda, "_driver_call", lambda name, *args: name)
    monkeypatch.setattr(jcuda, "_torch_device_ordinal", lambda: device[0])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    monkeypatch.setattr(codegen.launch, "_current_stream_handle", lambda index: 10 + index)
    monkeypatch.setattr(codegen.launch, "_compute_units", lambda: 1 << 10)
    monkeypatch.setattr(codegen.launch.Kernel, "binary", lambda self: b"")
    monkeypatch.setattr(codegen.launch.Kernel, "_place", place_at_address)  # CPU tensors at their addresses
    monkeypatch.setattr(codegen.jit, "load_module", lambda binary, target, backend: FakeModule())
    first, second = (replace(KERNELS[spec]) for spec in SPECS)  # Kernels of their own: none loaded yet
    bound = first.bind(**good_args(first))  # the first compile: cuda:1
    bound()
    device[0] = 0
    for kernel in (first, second):
        with pytest.raises(DeviceError, match=rf"{kernel.ir.kernel} .*cuda:0 is the current device.*loaded on cuda:1.*"
                                              r"torch.cuda.set_device\(1\)"):
            kernel.compile()
    with pytest.raises(DeviceError, match="loaded on cuda:1"):
        second(**good_args(second))
    with pytest.raises(DeviceError, match="cuda:0 is the current device.*loaded on cuda:1"):
        bound()
    assert launches == [11]
    device[0] = 1
    second(**good_args(second))
    bound()
    assert jcuda._primary["ordinal"] == 1 and codegen.jit.process_device(first.target) == 1
    assert launches == [11, 11, 11]


def test_host_launch_time_stub_runs():
    """scripts/host_launch_time.py --stub (our Python's share of a launch, no GPU) runs on this
    machine, in a process of its own (it replaces the driver and the launch's stream for good): a row
    of host times for each spec and S, the GPU-only columns left "-"."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "scripts/host_launch_time.py", "--stub", "--launches", "3", "--rounds", "1"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("minimax", "deepseek"))]
    assert [(r[0], r[1]) for r in rows] == [(k, s) for k in ("minimax_m3/pre_attn", "deepseek_v41/attn_front")
                                            for s in ("1", "16")]
    for r in rows:
        assert all(float(v) > 0 for v in r[2:6]) and r[6:] == ["-"] * 4


def test_written_arguments_may_not_share_memory(host_launch):
    """A tensor the kernel writes may not overlap another argument: an output over an input
    (h_out in place of res), an output inside another (iq_out within q_out), an output over the
    workspace (kt inside scratch); refused by both names, their spans and who writes, before any
    launch, also where only a runtime dimension's size changed. Inputs may share memory, the
    spec's may_alias pair may overlap (MiniMax's packed K / V cache: the V view starts inside the
    K view), and tensors side by side in one allocation are apart."""
    mm, ds = KERNELS["minimax_m3/pre_attn"], KERNELS["deepseek_v41/attn_front"]
    assert mm.ir.arg("k_cache").may_alias == ("v_cache",) and mm.ir.arg("v_cache").may_alias == ("k_cache",)
    args = good_args(mm)
    fp8, page = args["k_cache"].dtype, args["k_cache"].shape[1]
    pages = torch.zeros(RUNTIME + 2, page, dtype=torch.uint8)  # the K view, the V view 2 pages in
    kv = {"k_cache": pages[:RUNTIME].view(fp8), "v_cache": pages[2:].view(fp8)}
    assert kv["k_cache"].data_ptr() < kv["v_cache"].data_ptr() < kv["k_cache"].data_ptr() + kv["k_cache"].nbytes
    scales = torch.zeros(2, *args["k_scale"].shape)  # side by side
    mm(**{**args, **kv, "k_scale": scales[0], "v_scale": scales[1], "g_k": args["g_q"]})  # g_k is g_q: inputs
    assert len(host_launch.launches) == 1

    span = r"\(0x[0-9a-f]+\.\.0x[0-9a-f]+\)"
    with pytest.raises(ArgumentError, match=rf"arguments '(res|h_out)' {span} and '(res|h_out)' {span} share memory, "
                                            r"and the kernel writes 'h_out': give each its own memory"):
        mm(**{**args, "h_out": args["res"]})
    inner = args["q_out"].view(-1)[128: 128 + args["iq_out"].numel()].view(args["iq_out"].shape)
    with pytest.raises(ArgumentError, match=rf"arguments 'q_out' {span} and 'iq_out' {span} share memory, "
                                            r"and the kernel writes 'q_out' and 'iq_out'"):
        mm(**{**args, "iq_out": inner})
    # a launch with the arguments of an earlier one reuses its checks, but a runtime dimension's
    # new size at the same address is another argument set, checked again
    index = args["index_cache"]
    buf = torch.zeros((RUNTIME + 2) * page + index.nbytes, dtype=torch.uint8)
    after = buf[(RUNTIME + 1) * page: (RUNTIME + 1) * page + index.nbytes].view(index.dtype).view(index.shape)
    mm(**{**args, "k_cache": buf[: RUNTIME * page].view(fp8).view(RUNTIME, page), "index_cache": after})  # a page apart
    with pytest.raises(ArgumentError, match=rf"arguments 'k_cache' {span} and 'index_cache' {span} share memory"):
        mm(**{**args, "k_cache": buf[: (RUNTIME + 2) * page].view(fp8).view(RUNTIME + 2, page), "index_cache": after})
    assert len(host_launch.launches) == 2
    ds_args = good_args(ds)
    inside = ds_args["scratch"].view(torch.int32)[: ds_args["kt"].numel()].view(ds_args["kt"].shape)
    with pytest.raises(ArgumentError, match=r"arguments '(scratch|kt)' .* and '(scratch|kt)' .* share memory, "
                                            r"and the kernel writes '(scratch|kt)' and '(scratch|kt)'"):
        ds(**{**ds_args, "kt": inside})
    assert len(host_launch.launches) == 2
