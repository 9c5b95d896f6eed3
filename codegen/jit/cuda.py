"""NVIDIA backend: nvrtc compiles CUDA C++ to a CUBIN, the driver API loads it
into PyTorch's context and launches it.

Everything goes through ``cuda.bindings`` (cuda-python): every call returns a
tuple whose first item is the status; ``_check`` turns a failed status into an
exception naming it. The compile half needs no GPU and no driver (nvrtc is a
plain library from the ``nvidia-cuda-nvrtc`` wheel); the module/launch half
needs the driver (libcuda) and a GPU."""

from __future__ import annotations

import functools
import threading
from typing import Any, Sequence

from ._launch import KernelParams, dim3 as _dim3
from .errors import BackendUnavailable, CompileError

# The options every CUBIN is built with. --fmad=false: no contraction of a*b+c
# into FMA, so results match the reference bit for bit where the contract is
# exact; no --use_fast_math, for the same reason.
BASE_OPTIONS: tuple[str, ...] = ("--fmad=false", "-std=c++17", "-default-device", "-lineinfo")

# --------------------------------------------------------------------------- bindings


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise BackendUnavailable("cuda", f"cuda-python (cuda.bindings.nvrtc) cannot be imported: {e}") from e
    return nvrtc


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise BackendUnavailable("cuda", f"cuda-python (cuda.bindings.driver) cannot be imported: {e}") from e
    return driver


class CudaError(RuntimeError):
    """A CUDA driver or nvrtc call returned an error status."""

    def __init__(self, call: str, status: Any, detail: str = ""):
        self.call = call
        self.status = status
        name = getattr(status, "name", str(status))
        msg = f"{call} failed: {name}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


def _status_detail(status: Any) -> str:
    """The driver's description of ``status``, if it can be had."""
    try:
        driver = _driver()
        if isinstance(status, driver.CUresult):
            err, s = driver.cuGetErrorString(status)
            if err == driver.CUresult.CUDA_SUCCESS and s:
                return s.decode() if isinstance(s, bytes) else str(s)
    except Exception:  # noqa: BLE001 - best effort only
        pass
    return ""


def _check(result: tuple, call: str):
    """The values after the status of a cuda.bindings result tuple; CudaError
    naming ``call`` and the status if it is not success."""
    status, rest = result[0], result[1:]
    if int(status) != 0:  # CUDA_SUCCESS and NVRTC_SUCCESS are both 0
        raise CudaError(call, status, _status_detail(status))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _driver_missing_error() -> tuple[type[BaseException], ...]:
    try:
        from cuda.pathfinder import DynamicLibNotFoundError
    except ImportError:  # older cuda-python: libcuda failure is a RuntimeError
        return ()
    return (DynamicLibNotFoundError,)


def _driver_call(fn_name: str, *args):
    """``driver.<fn_name>(*args)``, checked; BackendUnavailable if libcuda cannot
    be loaded (no NVIDIA driver on this machine)."""
    driver = _driver()
    fn = getattr(driver, fn_name)
    try:
        result = fn(*args)
    except _driver_missing_error() as e:
        raise BackendUnavailable(
            "cuda", f"the NVIDIA driver library (libcuda.so) cannot be loaded: {e}",
            "install the NVIDIA driver (a GPU is needed to load and launch kernels; "
            "compiling needs only pip install 'mono-codegen[cuda]')",
        ) from e
    return _check(result, fn_name)


# --------------------------------------------------------------------------- compile


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """``nvrtc MAJOR.MINOR`` of the nvrtc library in use."""
    nvrtc = _nvrtc()
    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"nvrtc {major}.{minor}"


def options(target, extra: Sequence[str] = ()) -> list[str]:
    """The nvrtc options for ``target`` (its ``arch``, e.g. ``sm_90a``)."""
    return [f"--gpu-architecture={target.arch}", *BASE_OPTIONS, *extra]


# nvrtc writes into the buffer it is given, so each is a fresh bytearray: a bytes object is
# immutable and may be shared (``b" " * 1`` is CPython's one cached b" ", which an empty log's
# NUL would overwrite for the whole process)
def _program_log(nvrtc, prog) -> str:
    size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = bytearray(size)
    _check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return bytes(buf).rstrip(b"\x00").decode("utf-8", "replace")


def nvrtc_build(
    source: str, name: str, opts: Sequence[str], *, want_cubin: bool = True, want_ptx: bool = False
) -> tuple[bytes | None, str | None, str]:
    """Compile ``source`` (named ``name``) with nvrtc ``opts``.

    Returns (CUBIN or None, PTX text or None, program log); CompileError with the
    log if compilation fails."""
    nvrtc = _nvrtc()
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        bopts = [o.encode() for o in opts]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(bopts), bopts)
        log = _program_log(nvrtc, prog)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            if status == nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION:
                raise CompileError(log, source, name, compiler_version())
            raise CudaError("nvrtcCompileProgram", status, log.strip())
        cubin = ptx = None
        if want_cubin:
            size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            if size == 0:
                raise CudaError(
                    "nvrtcGetCUBIN", "empty CUBIN", f"is {opts[0]} a real (sm_XX) architecture?"
                )
            buf = bytearray(size)
            _check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
            cubin = bytes(buf)
        if want_ptx:
            size = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            buf = bytearray(size)
            _check(nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            ptx = bytes(buf).rstrip(b"\x00").decode("utf-8", "replace")
        return cubin, ptx, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile(source: str, name: str, target, extra_options: Sequence[str] = ()) -> bytes:  # noqa: A001
    """CUBIN of ``source`` for ``target.arch`` (e.g. ``sm_90a``). ``name`` is the
    file name the source is compiled (and its errors reported) under."""
    cubin, _, _ = nvrtc_build(source, name, options(target, extra_options))
    assert cubin is not None
    return cubin


# --------------------------------------------------------------------------- context


_ctx_lock = threading.Lock()
_tls = threading.local()
_primary: dict[str, Any] = {}  # "ordinal": int, "device": CUdevice, "ctx": CUcontext


def _torch_device_ordinal() -> int | None:
    """Initialise PyTorch's CUDA state and return its current device, or None if
    PyTorch (with CUDA) is not there: then the driver alone picks device 0."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.cuda.init()
    return int(torch.cuda.current_device())


def _primary_context() -> Any:
    """The primary context of PyTorch's current device (retained once, for the
    process' life, as PyTorch keeps it too)."""
    with _ctx_lock:
        if "ctx" not in _primary:
            ordinal = _torch_device_ordinal()
            _driver_call("cuInit", 0)
            ordinal = 0 if ordinal is None else ordinal
            device = _driver_call("cuDeviceGet", ordinal)
            ctx = _driver_call("cuDevicePrimaryCtxRetain", device)
            _primary.update(ordinal=ordinal, device=device, ctx=ctx)
        return _primary["ctx"]


def process_device() -> int:
    """The ordinal of the device whose primary context this process's modules live in."""
    _primary_context()
    return _primary["ordinal"]


def ensure_context() -> Any:
    """Make sure this thread has a current CUDA context and return it: the one
    already current (PyTorch's, once PyTorch has touched the GPU in this thread),
    else the primary context of PyTorch's current device, which is the one
    PyTorch uses, made current here."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is not None:
        return ctx
    primary = _primary_context()  # also initialises torch and the driver
    current = _driver_call("cuCtxGetCurrent")
    if current is None or int(current) == 0:
        _driver_call("cuCtxSetCurrent", primary)
        current = primary
    _tls.ctx = current
    return current


def current_device():
    """The CUdevice of the current context (after ``ensure_context``)."""
    ensure_context()
    return _driver_call("cuCtxGetDevice")


def device_sm_count() -> int:
    """Streaming multiprocessors on the current device (132 on an H100/H200 SXM)."""
    driver = _driver()
    dev = current_device()
    return int(
        _driver_call(
            "cuDeviceGetAttribute", driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev
        )
    )


# --------------------------------------------------------------------------- module / function


class CudaModule:
    """A CUBIN loaded into PyTorch's CUDA context."""

    def __init__(self, cubin: bytes):
        ensure_context()
        self._driver = _driver()
        self.handle = _driver_call("cuModuleLoadData", cubin)
        self._functions: dict[str, CudaFunction] = {}

    def function(self, name: str) -> "CudaFunction":
        """The kernel called ``name`` (its ``extern "C"`` name, or mangled)."""
        fn = self._functions.get(name)
        if fn is None:
            handle = _driver_call("cuModuleGetFunction", self.handle, name.encode())
            fn = self._functions[name] = CudaFunction(self, name, handle)
        return fn

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle is not None:
            try:
                self._driver.cuModuleUnload(handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown, context gone
                pass


class CudaFunction:
    """One kernel of a loaded module. Keeps its module alive."""

    def __init__(self, module: CudaModule, name: str, handle):
        self.module = module
        self.name = name
        self.handle = handle
        self._dyn_smem_max = 0
        # (grid, block, LDS, cooperative, pdl, stream) -> its launch config (CudaLaunch._config),
        # shared by every prepared launch of that shape: the config does not hold the
        # arguments, and building one takes ~20 us of Python with PDL (a CUstream ~1 us without)
        self._launch_configs: dict[tuple, Any] = {}

    def _attr(self, which: str) -> int:
        driver = _driver()
        attr = getattr(driver.CUfunction_attribute, which)
        return int(_driver_call("cuFuncGetAttribute", attr, self.handle))

    def _set_attr(self, which: str, value: int) -> None:
        driver = _driver()
        _driver_call("cuFuncSetAttribute", self.handle, getattr(driver.CUfunction_attribute, which), int(value))

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow launches with up to ``nbytes`` of dynamic shared memory (needed
        past 48 KiB)."""
        self._set_attr("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", nbytes)
        self._dyn_smem_max = int(nbytes)

    def set_shared_carveout(self, percent: int) -> None:
        """Prefer ``percent`` (0..100) of the SM's unified L1 / shared memory as shared memory for
        this kernel's launches (the spec's grid.smem_carveout); -1: no preference (the driver's)."""
        self._set_attr("CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT", percent)

    def attributes(self) -> dict[str, int]:
        """Registers per thread, static shared and local (spill/stack) bytes per
        thread, and the largest block this kernel can launch with."""
        return {
            "num_regs": self._attr("CU_FUNC_ATTRIBUTE_NUM_REGS"),
            "shared_size_bytes": self._attr("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
            "local_size_bytes": self._attr("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
            "max_threads_per_block": self._attr("CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
            "max_dynamic_shared_size_bytes": self._attr("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"),
        }

    def max_active_blocks_per_sm(self, threads: int, dyn_smem: int) -> int:
        """Blocks of ``threads`` threads and ``dyn_smem`` dynamic shared bytes that
        fit on one SM at once."""
        return int(
            _driver_call("cuOccupancyMaxActiveBlocksPerMultiprocessor", self.handle, int(threads), int(dyn_smem))
        )

    def max_cooperative_grid(self, threads: int, dyn_smem: int) -> int:
        """The largest grid a cooperative launch of this shape may use."""
        return self.max_active_blocks_per_sm(threads, dyn_smem) * device_sm_count()

    def launch(
        self,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        dyn_smem: int,
        stream: int,
        args: Sequence[tuple[str, int | float]],
        cooperative: bool = False,
        pdl: bool = False,
    ) -> None:
        """Launch on ``stream`` (a raw ``cudaStream_t`` as an int, e.g.
        ``torch.cuda.current_stream().cuda_stream``; 0 is the legacy default
        stream). ``args``: ``(ctype, value)`` pairs in the kernel's parameter
        order, ctype one of u64 (pointers: ``tensor.data_ptr()``), i64, u32,
        i32, f32, f64. ``cooperative`` uses cuLaunchCooperativeKernel, whose
        grid must be co-resident (see ``max_cooperative_grid``). ``pdl``:
        programmatic dependent launch (cuLaunchKernelEx with
        PROGRAMMATIC_STREAM_SERIALIZATION, and COOPERATIVE when asked): the
        launch may begin before the stream's previous kernel has completed,
        so the kernel must run ``griddepcontrol.wait`` before it touches
        memory that kernel writes (sm90; CUDA graphs keep the edge)."""
        self.prepare(grid, block, dyn_smem, args, cooperative, pdl)(stream)

    def prepare(self, grid: int | Sequence[int], block: int | Sequence[int], dyn_smem: int,
                args: Sequence[tuple[str, int | float]], cooperative: bool = False, pdl: bool = False) -> "CudaLaunch":
        """``launch`` with everything but the stream checked and packed once: a
        launcher whose calls take only the stream (``prepared(stream)``)."""
        return CudaLaunch(self, _dim3(grid, "grid"), _dim3(block, "block"), int(dyn_smem), KernelParams(args),
                          cooperative, pdl)


class CudaLaunch:
    """One launch of a CudaFunction, prepared (``CudaFunction.prepare``): its dimensions and
    packed arguments; it takes its config for each stream from the function (built once per
    shape and stream, never changed after, so calls from several threads are safe)."""

    def __init__(self, fn: CudaFunction, grid: tuple[int, int, int], block: tuple[int, int, int], dyn_smem: int,
                 params: KernelParams, cooperative: bool, pdl: bool):
        self.fn, self.grid, self.block, self.dyn_smem = fn, grid, block, dyn_smem
        self.params, self.cooperative, self.pdl = params, cooperative, pdl

    def __call__(self, stream: int) -> None:
        ensure_context()
        params = self.params.address
        key = (self.grid, self.block, self.dyn_smem, self.cooperative, self.pdl, stream)
        config = self.fn._launch_configs.get(key)
        if config is None:
            config = self.fn._launch_configs.setdefault(key, self._config(stream))
        if self.pdl:
            _driver_call("cuLaunchKernelEx", config, self.fn.handle, params, 0)
        elif self.cooperative:
            _driver_call("cuLaunchCooperativeKernel", self.fn.handle, *config, params)
        else:
            _driver_call("cuLaunchKernel", self.fn.handle, *config, params, 0)

    def _config(self, stream: int):
        """The launch's config on ``stream``: without PDL, cuLaunchKernel's dimensions, LDS and
        CUstream; with it, cuLaunchKernelEx's CUlaunchConfig (PROGRAMMATIC_STREAM_SERIALIZATION,
        and COOPERATIVE when asked)."""
        driver = _driver()
        if not self.pdl:
            return (*self.grid, *self.block, self.dyn_smem, driver.CUstream(int(stream)))
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = self.grid
        config.blockDimX, config.blockDimY, config.blockDimZ = self.block
        config.sharedMemBytes = self.dyn_smem
        config.hStream = driver.CUstream(int(stream))

        def attribute(name: str, field: str):
            attr = driver.CUlaunchAttribute()
            attr.id = getattr(driver.CUlaunchAttributeID, f"CU_LAUNCH_ATTRIBUTE_{name}")
            setattr(attr.value, field, 1)
            return attr

        attrs = [attribute("PROGRAMMATIC_STREAM_SERIALIZATION", "programmaticStreamSerializationAllowed")]
        if self.cooperative:
            attrs.append(attribute("COOPERATIVE", "cooperative"))
        config.attrs = attrs
        config.numAttrs = len(attrs)
        return config
