"""codegen.jit: compiling for each target with no GPU, resource reports, compile
errors, the disk cache, argument packing, and the HIP backend without ROCm.
One GPU test (marked ``gpu``) loads and launches a kernel where a GPU is."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import os
import sys
import time
import types
from pathlib import Path

import pytest

from codegen import jit
from codegen.jit import cache
from codegen.jit.offline import ResourceReport, amd_waves_per_simd
from codegen.targets import TARGETS

AMD_TARGETS = [t for t in TARGETS.values() if t.vendor == "amd"]
SM90 = TARGETS["sm90"]

# A self-contained prelude instead of ROCm's headers (clang gets -nogpuinc).
AMD_PRELUDE = """\
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
typedef long v2l __attribute__((ext_vector_type(2)));
typedef float v4f __attribute__((ext_vector_type(4)));
static __device__ inline int tid() { return __builtin_amdgcn_workitem_id_x(); }
static __device__ inline int bid() { return __builtin_amdgcn_workgroup_id_x(); }
"""

AMD_SCALE = AMD_PRELUDE + """\
extern "C" __global__ void scale(float* x, float s, int n) {
  int i = bid() * 256 + tid();
  if (i < n) x[i] = x[i] * s;
}
"""

AMD_MFMA = AMD_PRELUDE + """\
extern "C" __global__ void mfma_fp8(const long* a, const long* b, v4f* c) {
  int t = tid();
  v4f acc = c[t];
  acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a[t], b[t], acc, 0, 0, 0);
  acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a[t + 64], b[t + 64], acc, 0, 0, 0);
  c[t] = acc;
}
"""

CUDA_SCALE = """\
extern "C" __global__ void scale(float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * s;
}
"""

CUDA_MMA = """\
extern "C" __global__ void mma_fp8(const unsigned* a, const unsigned* b, float* c) {
  int t = threadIdx.x;
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a[4 * t]), "r"(a[4 * t + 1]), "r"(a[4 * t + 2]), "r"(a[4 * t + 3]),
        "r"(b[2 * t]), "r"(b[2 * t + 1]));
  c[4 * t] = d0; c[4 * t + 1] = d1; c[4 * t + 2] = d2; c[4 * t + 3] = d3;
}
"""

BAD_LINE = "  float y = x[0] +* ;"
BAD_BODY = f"""\
extern "C" __global__ void broken(float* x) {{
  int i = 0;
{BAD_LINE}
  x[i] = 1.0f;
}}
"""


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    """Every test gets its own cache folder."""
    d = tmp_path / "cache"
    monkeypatch.setenv("MONO_CACHE_DIR", str(d))
    cache._warned_dirs.clear()
    return d


def entries(d: Path) -> list[Path]:
    return sorted(d.glob("*.bin")) if d.is_dir() else []


# --------------------------------------------------------------------------- compile + reports


@pytest.mark.parametrize("target", AMD_TARGETS, ids=lambda t: t.name)
def test_amd_report_parses_resources(target):
    (r,) = jit.resource_report(AMD_SCALE, "scale.hip", target)
    assert isinstance(r, ResourceReport)
    assert r.name == "scale" and r.target == target.name
    assert r.vgprs > 0 and r.sgprs > 0
    assert r.spills == 0 and r.vgpr_spills == 0 and r.sgpr_spills == 0
    assert r.scratch_bytes == 0 and r.lds_bytes == 0
    assert r.max_threads > 0
    assert r.mfma == {}
    assert r.occupancy_waves_per_simd == 8  # a handful of VGPRs: the 8-wave cap


@pytest.mark.parametrize("target", AMD_TARGETS, ids=lambda t: t.name)
def test_amd_report_counts_mfma(target):
    (r,) = jit.resource_report(AMD_MFMA, "mfma.hip", target)
    assert r.name == "mfma_fp8"
    assert r.mfma.get(target.mma) == 2, r.mfma
    assert r.mfma_total == 2
    assert r.spills == 0


def test_amd_waves_from_vgprs():
    assert amd_waves_per_simd(1) == 8
    assert amd_waves_per_simd(64) == 8
    assert amd_waves_per_simd(65) == 7  # 72 allocated -> 512 // 72
    assert amd_waves_per_simd(128) == 4
    assert amd_waves_per_simd(512) == 1


def test_sm90_compiles_to_cubin():
    binary, cached = jit.compile_binary_cached(CUDA_SCALE, "scale.cu", SM90)
    assert binary[:4] == b"\x7fELF" and not cached
    (r,) = jit.resource_report(CUDA_SCALE, "scale.cu", SM90)
    assert r.name == "scale" and r.target == "sm90"
    assert r.vgprs > 0
    assert r.spills == 0 and r.scratch_bytes == 0
    assert 1 <= r.occupancy_waves_per_simd <= 16


def test_sm90_report_counts_mma():
    (r,) = jit.resource_report(CUDA_MMA, "mma.cu", SM90)
    assert r.mfma == {SM90.mma: 1}, r.mfma
    assert r.vgprs > 0


def test_backend_mismatch_is_refused():
    with pytest.raises(ValueError, match="AMD"):
        jit.compile_binary(AMD_SCALE, "scale.hip", TARGETS["gfx942"], backend="cuda")
    with pytest.raises(ValueError, match="NVIDIA"):
        jit.compile_binary(CUDA_SCALE, "scale.cu", SM90, backend="hip")


# --------------------------------------------------------------------------- compile errors


def _assert_points_at_bad_line(err: jit.CompileError, name: str, bad_line_no: int):
    text = str(err)
    assert err.log and err.log in text
    assert err.name == name
    assert bad_line_no in err.lines
    marked = [ln for ln in text.splitlines() if ln.startswith(">")]
    assert marked, text
    assert any(BAD_LINE.strip() in ln and f" {bad_line_no} |" in ln for ln in marked), text


def test_clang_compile_error_shows_numbered_source():
    source = AMD_PRELUDE + BAD_BODY
    bad_no = source.splitlines().index(BAD_LINE) + 1
    with pytest.raises(jit.CompileError) as info:
        jit.resource_report(source, "gen/broken.hip", TARGETS["gfx942"])
    _assert_points_at_bad_line(info.value, "gen/broken.hip", bad_no)
    assert entries(Path(os.environ["MONO_CACHE_DIR"])) == []  # failures are not cached


def test_nvrtc_compile_error_shows_numbered_source():
    source = BAD_BODY
    bad_no = source.splitlines().index(BAD_LINE) + 1
    with pytest.raises(jit.CompileError) as info:
        jit.compile_binary(source, "broken.cu", SM90)
    _assert_points_at_bad_line(info.value, "broken.cu", bad_no)
    with pytest.raises(jit.CompileError):  # the report path raises the same way
        jit.resource_report(source, "broken.cu", SM90)


def test_nvrtc_empty_log_leaves_python_bytes_alone():
    """nvrtc writes its program log into the buffer it is given; an empty log is one NUL. Written
    into ``b" " * 1`` (CPython's one cached b" ") it turned every later b" " of the process into
    b"\\x00": on the H200 one pytest worker's later template renders then failed inside Jinja2
    (bench/NOTES.md DeepSeek session 40). The buffers are bytearrays now."""
    from codegen.jit import cuda

    cubin, _, log = cuda.nvrtc_build('extern "C" __global__ void k(int* p) { p[0] = 1; }', "k.cu", cuda.options(SM90))
    assert log == "" and cubin[:4] == b"\x7fELF"  # the empty log: the case that wrote the NUL
    assert bytes([32])[0] == 32 and b" ".join([b"a", b"b"]) == bytearray(b"a b")


def test_compile_error_excerpt_format():
    src = "\n".join(f"line{i}" for i in range(1, 21))
    log = "k.cu(10): error: bad\nk.cu:12:3: error: worse\nother.cu(5): error: not ours\n"
    err = jit.CompileError(log, src, "k.cu")
    assert err.lines == [10, 12]
    text = str(err)
    assert "> 10 | line10" in text and "> 12 | line12" in text
    assert "\n   7 | line7\n" in text and "\n  15 | line15" in text
    excerpts = text.split(log.rstrip())[1]
    assert "| line6\n" not in excerpts and "| line16" not in excerpts  # 3 lines either side


# --------------------------------------------------------------------------- cache


def test_cache_second_call_is_cached(cache_in_tmp):
    a, cached_a = jit.compile_binary_cached(CUDA_SCALE, "scale.cu", SM90)
    b, cached_b = jit.compile_binary_cached(CUDA_SCALE, "scale.cu", SM90)
    assert (cached_a, cached_b) == (False, True) and a == b
    assert len(entries(cache_in_tmp)) == 1
    # a different source or target is another entry
    jit.compile_binary_cached(CUDA_SCALE + "\n", "scale.cu", SM90)
    assert len(entries(cache_in_tmp)) == 2
    # reports are cached too
    r1 = jit.resource_report(AMD_SCALE, "scale.hip", TARGETS["gfx942"])
    n = len(entries(cache_in_tmp))
    r2 = jit.resource_report(AMD_SCALE, "scale.hip", TARGETS["gfx942"])
    assert r1 == r2 and len(entries(cache_in_tmp)) == n == 3


def test_cache_key_sorts_options_and_sees_everything_else():
    base = {"source": "s", "options": ["-a", "-b"], "compiler": "c 1", "arch": "x", "name": "k"}
    assert cache.key(base) == cache.key({**base, "options": ["-b", "-a"]})
    for field, other in [("source", "t"), ("compiler", "c 2"), ("arch", "y"), ("name", "j")]:
        assert cache.key(base) != cache.key({**base, field: other})
    assert cache.cache_dir() == Path(os.environ["MONO_CACHE_DIR"])


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("MONO_CACHE_DIR")
    assert cache.cache_dir() == Path.home() / ".cache" / "mono-codegen"


def _race_worker(cache_dir: str, marks: str, barrier, queue) -> None:
    os.environ["MONO_CACHE_DIR"] = cache_dir

    def build() -> bytes:
        # record the build, take long enough for the others to arrive, and
        # return bytes unique to this build
        fd = os.open(os.path.join(marks, f"built-{os.getpid()}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)
        time.sleep(0.5)
        return os.urandom(4096)

    barrier.wait()
    payload, cached = cache.get_or_build({"source": "race", "arch": "none"}, build)
    queue.put((payload, cached))


def test_cache_concurrent_processes_build_once(tmp_path, cache_in_tmp):
    ctx = multiprocessing.get_context("spawn")
    marks = tmp_path / "marks"
    marks.mkdir()
    barrier = ctx.Barrier(4)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_race_worker, args=(str(cache_in_tmp), str(marks), barrier, queue)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    payloads = {r[0] for r in results}
    assert len(payloads) == 1  # everyone got the one build's bytes
    assert sorted(r[1] for r in results) == [False, True, True, True]
    assert len(list(marks.iterdir())) == 1  # built once
    assert len(entries(cache_in_tmp)) == 1
    assert not list(cache_in_tmp.glob("*.tmp"))  # no temp files left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_cache_corrupt_entry_is_rebuilt(cache_in_tmp, caplog, damage):
    parts = {"source": "payload", "arch": "none"}
    builds = []

    def build() -> bytes:
        builds.append(1)
        return b"0123456789" * 100

    good, cached = cache.get_or_build(parts, build)
    assert not cached
    (path,) = entries(cache_in_tmp)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    else:
        path.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="codegen.jit.cache"):
        again, cached = cache.get_or_build(parts, build)
    assert again == good and not cached and len(builds) == 2
    assert any("corrupt" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    # the entry was rewritten whole
    assert cache.decode_entry(path.read_bytes()) == good
    assert cache.get_or_build(parts, build) == (good, True) and len(builds) == 2


def _unwritable_dir(tmp_path: Path) -> Path:
    """A cache folder this process cannot write: a read-only folder, or, as root
    (whom chmod does not stop), a path under a regular file."""
    ro = tmp_path / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        (ro / "probe").write_bytes(b"")
    except OSError:
        return ro / "cache"
    (ro / "probe").unlink()
    ro.chmod(0o755)
    blocker = tmp_path / "somefile"
    blocker.write_bytes(b"not a folder")
    return blocker / "sub"


def test_cache_unwritable_dir_warns_and_compiles(tmp_path, monkeypatch, caplog):
    d = _unwritable_dir(tmp_path)
    monkeypatch.setenv("MONO_CACHE_DIR", str(d))
    with caplog.at_level(logging.WARNING, logger="codegen.jit.cache"):
        b1, c1 = jit.compile_binary_cached(CUDA_SCALE, "scale.cu", SM90)
        b2, c2 = jit.compile_binary_cached(CUDA_SCALE, "scale.cu", SM90)
        reports = jit.resource_report(AMD_SCALE, "scale.hip", TARGETS["gfx942"])
    assert b1 == b2 and b1[:4] == b"\x7fELF" and (c1, c2) == (False, False)
    assert reports[0].vgprs > 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # one warning, not one per call
    assert str(d) in warnings[0] and "MONO_CACHE_DIR" in warnings[0]


# --------------------------------------------------------------------------- launch arguments


def test_kernel_params_are_what_cuda_bindings_passes():
    """KernelParams' address is a void** that cuda.bindings takes as kernelParams unchanged
    (its int form): read the values back through the pointer it holds."""
    from cuda.bindings import driver

    from codegen.jit._launch import KernelParams

    args = [("u64", 0xDEADBEEF12345678), ("f32", 1.5), ("i32", -7), ("i64", -(2**40)), ("u32", 2**32 - 1)]
    params = KernelParams(args)
    node = driver.CUDA_KERNEL_NODE_PARAMS()
    node.kernelParams = params.address
    assert int(node.kernelParams) == params.address
    ptrs = (ctypes.c_void_p * len(args)).from_address(int(node.kernelParams))
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0xDEADBEEF12345678
    assert ctypes.c_float.from_address(ptrs[1]).value == 1.5
    assert ctypes.c_int32.from_address(ptrs[2]).value == -7
    assert ctypes.c_int64.from_address(ptrs[3]).value == -(2**40)
    assert ctypes.c_uint32.from_address(ptrs[4]).value == 2**32 - 1
    assert KernelParams([]).address is None  # a kernel with no parameters: NULL


def test_pack_args_rejects_bad_values():
    from codegen.jit._launch import pack_args

    with pytest.raises(OverflowError):
        pack_args([("i32", 2**31)])
    with pytest.raises(OverflowError):
        pack_args([("u64", -1)])
    with pytest.raises(TypeError):
        pack_args([("i32", 1.5)])
    with pytest.raises(TypeError):
        pack_args([("f16", 1.0)])
    assert pack_args([]) == ((), ())


# --------------------------------------------------------------------------- backends missing


def test_hip_backend_without_hip_python(monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)  # makes `from hip import ...` fail
    from codegen.jit import hip as hip_backend

    hip_backend.compiler_version.cache_clear()
    with pytest.raises(jit.BackendUnavailable) as info:
        jit.compile_binary(AMD_SCALE, "scale.hip", TARGETS["gfx942"])
    msg = str(info.value)
    assert "rocm" in msg.lower() and "pip install 'mono-codegen[rocm]'" in msg and "hip-python" in msg
    with pytest.raises(jit.BackendUnavailable):
        jit.load_module(b"\x7fELF", TARGETS["gfx942"])
    assert isinstance(info.value, RuntimeError)


# --------------------------------------------------------------------------- on a GPU


def _cuda_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.version.cuda is not None
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_gpu(), reason="needs an NVIDIA GPU and PyTorch with CUDA")
def test_cuda_load_and_launch():
    import torch

    from codegen.jit.cuda import device_sm_count

    x = torch.randn(1000, device="cuda")
    ref = x * 3.0
    binary = jit.compile_binary(CUDA_SCALE, "scale.cu", SM90)
    fn = jit.load_module(binary, SM90).function("scale")
    attrs = fn.attributes()
    assert attrs["num_regs"] > 0 and attrs["max_threads_per_block"] >= 256
    assert fn.max_active_blocks_per_sm(256, 0) >= 1
    assert device_sm_count() == torch.cuda.get_device_properties(0).multi_processor_count
    stream = torch.cuda.current_stream().cuda_stream
    fn.launch(4, 256, 0, stream, [("u64", x.data_ptr()), ("f32", 3.0), ("i32", x.numel())])
    torch.cuda.synchronize()
    assert torch.equal(x, ref)
    fn.set_max_dynamic_shared(64 * 1024)
    fn.set_shared_carveout(100)  # read back, and a launch under it
    assert fn._attr("CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT") == 100
    fn.launch(4, 256, 64 * 1024, stream, [("u64", x.data_ptr()), ("f32", 0.5), ("i32", x.numel())], cooperative=True)
    torch.cuda.synchronize()
    assert torch.equal(x, ref * 0.5)


# where each launch call of the CUDA driver takes its kernelParams
PARAMS_AT = {"cuLaunchKernelEx": 2, "cuLaunchCooperativeKernel": 9, "cuLaunchKernel": 9}


def record_launches(monkeypatch, types) -> list:
    """The CUDA backend's driver calls, recorded without a GPU as (name, args, values): values are
    read from the kernelParams array (a void** address) as ``types`` at the call, as the driver
    copies them then (the array is the launch's, and may be gone after it)."""
    from codegen.jit import cuda as jcuda

    calls = []

    def driver_call(name, *args):
        pointers = (ctypes.c_void_p * len(types)).from_address(args[PARAMS_AT[name]])
        values = [ctypes.cast(p, ctypes.POINTER(t)).contents.value for p, t in zip(pointers, types)]
        calls.append((name, args, values))

    monkeypatch.setattr(jcuda, "ensure_context", lambda: None)
    monkeypatch.setattr(jcuda, "_driver_call", driver_call)
    return calls


@pytest.mark.parametrize("cooperative", [False, True])
def test_cuda_pdl_launch_config(monkeypatch, cooperative):
    """launch(pdl=True) without a GPU: one cuLaunchKernelEx whose config carries the grid, block,
    LDS and stream, the programmatic-stream-serialization attribute and, when asked, the
    cooperative one; the arguments as the void** array of their packed values."""
    from codegen.jit import cuda as jcuda
    from codegen.jit._launch import pack_args

    args = [("u64", 0x1000), ("f32", 0.5), ("i32", 7)]
    calls = record_launches(monkeypatch, pack_args(args)[1])
    fn = jcuda.CudaFunction(None, "k", "handle")
    fn.launch(132, 512, 45840, 0, args, cooperative=cooperative, pdl=True)
    ((name, (config, handle, _, extra), values),) = calls
    assert (name, handle, extra, values) == ("cuLaunchKernelEx", "handle", 0, [0x1000, 0.5, 7])
    assert (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY,
            config.blockDimZ, config.sharedMemBytes) == (132, 1, 1, 512, 1, 1, 45840)
    ids = jcuda._driver().CUlaunchAttributeID
    attrs = {a.id: a for a in config.attrs[:config.numAttrs]}
    assert attrs[ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION].value.programmaticStreamSerializationAllowed == 1
    assert (ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE in attrs) is cooperative and len(attrs) == 1 + cooperative
    if cooperative:
        assert attrs[ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE].value.cooperative == 1
    calls.clear()
    fn.launch(132, 512, 45840, 0, args, cooperative=cooperative)  # no pdl: the plain launch calls
    ((name, (handle, *shape, stream, _), values),) = calls if cooperative else [(n, a[:-1], v) for n, a, v in calls]
    assert name == ("cuLaunchCooperativeKernel" if cooperative else "cuLaunchKernel")
    assert (handle, shape, int(stream), values) == ("handle", [132, 1, 1, 512, 1, 1, 45840], 0, [0x1000, 0.5, 7])
    assert cooperative or calls[0][1][-1] == 0  # cuLaunchKernel's `extra`: none
    # HIP has no such launch: asked for, refused before anything is launched
    from codegen.jit.hip import HipFunction

    with pytest.raises(ValueError, match="HIP has no programmatic dependent launch"):
        HipFunction(None, "k", "handle").launch(132, 512, 0, 0, args, cooperative=cooperative, pdl=True)


@pytest.mark.parametrize("pdl", [False, True])
def test_cuda_prepared_launch(monkeypatch, pdl):
    """prepare() packs once: every call passes the same kernelParams array (its values still
    there after the arguments' list is gone), on the stream it is given; it builds one config
    per stream (with PDL a CUlaunchConfig, else the CUstream) and reuses it, as do the
    function's other prepared launches of that shape (another shape builds its own)."""
    from codegen.jit import cuda as jcuda

    calls = record_launches(monkeypatch, [ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint32])
    args = [("u64", 0xABC0), ("i32", -3), ("u32", 2**32 - 1)]
    fn = jcuda.CudaFunction(None, "k", "handle")
    prepared = fn.prepare((4, 2), 256, 0, args, cooperative=True, pdl=pdl)
    del args
    for stream in (0, 77, 0):
        prepared(stream)
    assert all(values == [0xABC0, -3, 2**32 - 1] for _, _, values in calls)
    assert len({passed[PARAMS_AT[name]] for name, passed, _ in calls}) == 1
    if pdl:
        configs = [passed[0] for _, passed, _ in calls]
        assert configs[0] is configs[2] and configs[0] is not configs[1]
        assert [int(c.hStream) for c in configs] == [0, 77, 0]
        other_args = [("u64", 0xDEF0), ("i32", 5), ("u32", 6)]
        fn.prepare((4, 2), 256, 0, other_args, cooperative=True, pdl=True)(77)
        fn.prepare((4, 2), 256, 0, other_args, cooperative=False, pdl=True)(77)
        assert calls[3][1][0] is configs[1] and calls[3][2] == [0xDEF0, 5, 6]
        assert calls[4][1][0] is not configs[1] and calls[4][1][0].numAttrs == 1  # not cooperative
    else:
        assert [(name, int(passed[8])) for name, passed, _ in calls] == [("cuLaunchCooperativeKernel", s)
                                                                         for s in (0, 77, 0)]
        assert all(passed[1:7] == (4, 2, 1, 256, 1, 1) for _, passed, _ in calls)
        streams = [passed[8] for _, passed, _ in calls]  # the CUstream, made once a stream
        assert streams[0] is streams[2] and streams[0] is not streams[1]
    with pytest.raises(OverflowError, match="kernel argument 1 \\(i32\\)"):
        jcuda.CudaFunction(None, "k", "handle").prepare(1, 32, 0, [("u64", 1), ("i32", 2**31)])


@pytest.mark.parametrize("cooperative", [False, True])
def test_hip_prepared_launch(monkeypatch, cooperative):
    """HipFunction.prepare without ROCm: each call passes hipModuleLaunch(Cooperative)Kernel the
    grid, block, LDS, the stream (0 as None, HIP's default stream) and the same list of the
    packed values' addresses, which still read as the arguments after their list is gone."""
    from codegen.jit import hip as jhip

    calls = []
    monkeypatch.setattr(jhip, "ensure_device", lambda: 0)
    monkeypatch.setattr(jhip, "_call", lambda module, name, *args: calls.append((module, name, args)))
    fn = jhip.HipFunction(types.SimpleNamespace(_hip="hip-module"), "k", "handle")
    args = [("u64", 0xBEEF00), ("f32", -2.5), ("i32", 9)]
    prepared = fn.prepare(304, (256, 1), 1024, args, cooperative=cooperative)
    del args
    for stream in (0, 1234):
        prepared(stream)
    name = "hipModuleLaunchCooperativeKernel" if cooperative else "hipModuleLaunchKernel"
    for (module, called, launch), stream in zip(calls, (None, 1234)):
        assert (module, called, launch[:9]) == ("hip-module", name, ("handle", 304, 1, 1, 256, 1, 1, 1024, stream))
        assert launch[10:] == (() if cooperative else (None,))  # hipModuleLaunchKernel's `extra`: none
        pointers = launch[9]
        assert [ctypes.cast(p, ctypes.POINTER(t)).contents.value
                for p, t in zip(pointers, (ctypes.c_uint64, ctypes.c_float, ctypes.c_int32))] == [0xBEEF00, -2.5, 9]
    assert calls[0][2][9] is calls[1][2][9]
    assert jhip.HipFunction(None, "k", "handle").prepare(1, 64, 0, [])._pointers is None  # no parameters: NULL


@pytest.mark.parametrize("tokens, carveout", [(1, 100), (6, 0)])
def test_kernel_load_sets_the_spec_carveout(monkeypatch, tokens, carveout):
    """Kernel.compile sets the build's grid.smem_carveout on the loaded function, through
    cuFuncSetAttribute's preferred-carveout attribute; a build that leaves it to the driver
    (-1: MiniMax tuned so) sets nothing. Without a GPU: the module load and the driver are stand-ins."""
    import codegen
    from codegen import launch
    from codegen.jit import cuda as jcuda

    calls = []
    monkeypatch.setattr(jcuda, "_driver_call", lambda name, *args: calls.append((name, args)) or 1)
    fn = jcuda.CudaFunction(None, "k", "handle")
    monkeypatch.setattr(jit, "load_module", lambda binary, target, backend: types.SimpleNamespace(function=lambda name: fn))
    monkeypatch.setattr(launch, "_compute_units", lambda: 132)
    monkeypatch.setattr(launch, "_claim_device", lambda kernel: None)  # no torch device here
    monkeypatch.setattr(launch.Kernel, "binary", lambda self: b"")
    monkeypatch.setattr(jcuda.CudaFunction, "max_active_blocks_per_sm", lambda self, threads, lds: 1)
    attr = jcuda._driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    kernel = codegen.load("deepseek_v41/attn_front", tokens=tokens, tp=4, ratio=1, target="sm90")
    assert kernel.ir.smem_carveout == carveout
    dataclasses.replace(kernel).compile()  # a copy: the in-process cache's kernel keeps no stand-in
    assert [args for name, args in calls if name == "cuFuncSetAttribute" and args[1] == attr] == [("handle", attr, carveout)]
    calls.clear()
    minimax = codegen.load("minimax_m3/pre_attn", tokens=1, target="sm90", tune={"grid.smem_carveout": -1})
    assert minimax.ir.smem_carveout == -1
    dataclasses.replace(minimax).compile()
    assert not [args for name, args in calls if name == "cuFuncSetAttribute" and args[1] == attr]


# y[i] = x[i] + 1 after a wait for the previous launch (PDL): chained launches add up only if
# each waits for the one before (a kernel that does not wait could read x before it is written)
CUDA_PDL = """\
extern "C" __global__ void add_one(const float* x, float* y, int n) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = x[i] + 1.0f;
}
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_gpu(), reason="needs an NVIDIA GPU and PyTorch with CUDA")
@pytest.mark.parametrize("cooperative", [False, True])
def test_cuda_pdl_launches_chain(cooperative):
    """launch(pdl=True): cuLaunchKernelEx with programmatic stream serialization (and the
    cooperative attribute), on a stream and inside a CUDA graph: 16 launches, each reading what
    the one before wrote, add up exactly."""
    import torch

    from tests.graphs import capture

    fn = jit.load_module(jit.compile_binary(CUDA_PDL, "add_one.cu", SM90), SM90).function("add_one")
    n = 1 << 20
    bufs = [torch.randint(-1000, 1000, (n,), device="cuda").float(), torch.empty(n, device="cuda")]
    start = bufs[0].clone()

    def chain():
        for i in range(16):
            src, dst = bufs[i % 2], bufs[(i + 1) % 2]
            fn.launch(fn.max_cooperative_grid(256, 0) if cooperative else 512, 256, 0,
                      torch.cuda.current_stream().cuda_stream,
                      [("u64", src.data_ptr()), ("u64", dst.data_ptr()), ("i32", n)], cooperative=cooperative, pdl=True)
    chain()
    torch.cuda.synchronize()
    assert torch.equal(bufs[0], start + 16.0)  # exact: integers
    graph = capture(chain)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bufs[0], start + 16.0 + 16.0)


CUDA_ARGS = """\
extern "C" __global__ void echo(unsigned long long* out, float f, int i, long long l, unsigned u,
                                unsigned long long p) {
  extern __shared__ unsigned char smem[];
  unsigned n = blockDim.x;
  for (unsigned k = threadIdx.x; k < 100 * 1024; k += n) smem[k] = (unsigned char)(k & 0xff);
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned sum = 0;
    for (unsigned k = 0; k < 100 * 1024; ++k) sum += smem[k];
    out[0] = (unsigned long long)__float_as_uint(f);
    out[1] = (unsigned long long)(long long)i;
    out[2] = (unsigned long long)l;
    out[3] = u;
    out[4] = p;
    out[5] = sum;
  }
}
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_gpu(), reason="needs an NVIDIA GPU and PyTorch with CUDA")
def test_cuda_arguments_and_large_dynamic_shared():
    import struct

    import torch

    out = torch.zeros(6, dtype=torch.int64, device="cuda")
    fn = jit.load_module(jit.compile_binary(CUDA_ARGS, "echo.cu", SM90), SM90).function("echo")
    fn.set_max_dynamic_shared(100 * 1024)
    assert fn.max_active_blocks_per_sm(256, 100 * 1024) >= 1
    grid = fn.max_cooperative_grid(256, 100 * 1024)
    args = [("u64", out.data_ptr()), ("f32", -2.5), ("i32", -123456), ("i64", -(2**40) - 5),
            ("u32", 0xFFFFFFF0), ("u64", 0x0123456789ABCDEF)]
    fn.launch(grid, 256, 100 * 1024, torch.cuda.current_stream().cuda_stream, args, cooperative=True)
    torch.cuda.synchronize()
    got = [v & (2**64 - 1) for v in out.tolist()]
    assert got[0] == struct.unpack("<I", struct.pack("<f", -2.5))[0]
    assert got[1] == (-123456) & (2**64 - 1)
    assert got[2] == (-(2**40) - 5) & (2**64 - 1)
    assert got[3] == 0xFFFFFFF0
    assert got[4] == 0x0123456789ABCDEF
    assert got[5] == sum(k & 0xFF for k in range(100 * 1024))
