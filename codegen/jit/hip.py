"""AMD backend: hiprtc compiles HIP C++ to a code object, the HIP module API
loads it and launches it, all through hip-python (``from hip import hip,
hiprtc``).

hip-python is imported lazily, inside the functions: it is an optional
dependency (``pip install 'mono-codegen[rocm]'``), and with no ROCm installed it
imports fine but fails at the first call (it cannot dlopen ``libhiprtc.so`` /
``libamdhip64.so``). Both cases raise ``BackendUnavailable`` saying so.

Every hip-python call returns a tuple whose first item is the status
(``hipError_t`` / ``hiprtcResult``); ``_check`` raises ``HipError`` naming it."""

from __future__ import annotations

import functools
import threading
from typing import Any, Sequence

from ._launch import KernelParams, dim3 as _dim3
from .errors import BackendUnavailable, CompileError

# -ffp-contract=off: no a*b+c -> FMA contraction, so results match the
# reference where the contract is exact (the AMD twin of nvrtc's --fmad=false).
BASE_OPTIONS: tuple[str, ...] = ("-ffp-contract=off", "-O3", "-std=c++17")

_INSTALL_HINT = (
    "install ROCm (libamdhip64.so and libhiprtc.so under $ROCM_PATH/lib, /opt/rocm "
    "by default) and hip-python: pip install 'mono-codegen[rocm]'"
)


class HipError(RuntimeError):
    """A HIP or hiprtc call returned an error status."""

    def __init__(self, call: str, status: Any, detail: str = ""):
        self.call = call
        self.status = status
        msg = f"{call} failed: {getattr(status, 'name', status)}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


def _bindings():
    """``(hip, hiprtc)`` from hip-python; BackendUnavailable if it is missing."""
    try:
        from hip import hip, hiprtc
    except ImportError as e:
        raise BackendUnavailable(
            "hip", f"hip-python is not installed (import of 'hip' failed: {e})", _INSTALL_HINT
        ) from e
    except Exception as e:  # noqa: BLE001 - a broken install fails in odd ways
        raise BackendUnavailable("hip", f"hip-python failed to import: {e}", _INSTALL_HINT) from e
    return hip, hiprtc


def _check(result: Any, call: str):
    """The values after the status of a hip-python result tuple; HipError if
    the status is not success (both hipSuccess and HIPRTC_SUCCESS are 0)."""
    if not isinstance(result, tuple):
        result = (result,)
    status, rest = result[0], result[1:]
    if int(status) != 0:
        raise HipError(call, status)
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _call(module: Any, fn_name: str, *args):
    """``module.<fn_name>(*args)``, checked. The first call into a library is
    where hip-python dlopens it: a failure there (no ROCm) is BackendUnavailable."""
    fn = getattr(module, fn_name)
    try:
        result = fn(*args)
    except RuntimeError as e:
        if "dlopen" in str(e) or "cannot open shared object" in str(e):
            raise BackendUnavailable(
                "hip", f"ROCm's libraries cannot be loaded ({e})", _INSTALL_HINT
            ) from e
        raise
    return _check(result, fn_name)


# --------------------------------------------------------------------------- compile


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """``hiprtc MAJOR.MINOR`` of the hiprtc library in use."""
    _, hiprtc = _bindings()
    major, minor = _call(hiprtc, "hiprtcVersion")
    return f"hiprtc {major}.{minor}"


def options(target, extra: Sequence[str] = ()) -> list[str]:
    """The hiprtc options for ``target`` (its ``arch``, e.g. ``gfx942``)."""
    return [f"--offload-arch={target.arch}", *BASE_OPTIONS, *extra]


def compile(source: str, name: str, target, extra_options: Sequence[str] = ()) -> bytes:  # noqa: A001
    """Code object (ELF, loadable by hipModuleLoadData) of ``source`` for
    ``target.arch``; CompileError with hiprtc's log if it does not compile."""
    _, hiprtc = _bindings()
    prog = _call(hiprtc, "hiprtcCreateProgram", source.encode(), name.encode(), 0, [], [])
    try:
        opts = [o.encode() for o in options(target, extra_options)]
        (status,) = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
        log_size = _call(hiprtc, "hiprtcGetProgramLogSize", prog)
        log = ""
        if log_size:
            buf = bytearray(log_size)
            _call(hiprtc, "hiprtcGetProgramLog", prog, buf)
            log = bytes(buf).rstrip(b"\x00").decode("utf-8", "replace")
        if int(status) != 0:
            if status == hiprtc.hiprtcResult.HIPRTC_ERROR_COMPILATION:
                raise CompileError(log, source, name, compiler_version())
            raise HipError("hiprtcCompileProgram", status, log.strip())
        size = _call(hiprtc, "hiprtcGetCodeSize", prog)
        code = bytearray(size)
        _call(hiprtc, "hiprtcGetCode", prog, code)
        return bytes(code)
    finally:
        try:
            hiprtc.hiprtcDestroyProgram(prog)
        except Exception:  # noqa: BLE001 - cleanup only
            pass


# --------------------------------------------------------------------------- device


_dev_lock = threading.Lock()
_dev: dict[str, int] = {}


def _torch_device_ordinal() -> int | None:
    """PyTorch's current device (a ROCm build of PyTorch answers through
    torch.cuda), or None without PyTorch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.cuda.init()
    return int(torch.cuda.current_device())


def process_device() -> int:
    """The device this process's modules load and launch on: PyTorch's current device at
    the first call (HIP initialised then), fixed after."""
    hip, _ = _bindings()
    with _dev_lock:
        if "ordinal" not in _dev:
            ordinal = _torch_device_ordinal()
            _call(hip, "hipInit", 0)
            _dev["ordinal"] = 0 if ordinal is None else ordinal
    return _dev["ordinal"]


def ensure_device() -> int:
    """Make the process's device (``process_device``) HIP's current device in this thread
    (HIP keeps one implicit context per device, shared with PyTorch) and return it."""
    hip, _ = _bindings()
    ordinal = process_device()
    _call(hip, "hipSetDevice", ordinal)
    return ordinal


def _device_attr(name: str) -> int:
    hip, _ = _bindings()
    ordinal = ensure_device()
    attr = getattr(hip.hipDeviceAttribute_t, name)
    return int(_call(hip, "hipDeviceGetAttribute", attr, ordinal))


def device_sm_count() -> int:
    """Compute units of the current device (304 on an MI300X)."""
    return _device_attr("hipDeviceAttributeMultiprocessorCount")


# --------------------------------------------------------------------------- module / function


class HipModule:
    """A code object loaded on PyTorch's current device."""

    def __init__(self, code_object: bytes):
        hip, _ = _bindings()
        ensure_device()
        self._hip = hip
        self.handle = _call(hip, "hipModuleLoadData", bytes(code_object))
        self._functions: dict[str, HipFunction] = {}

    def function(self, name: str) -> "HipFunction":
        fn = self._functions.get(name)
        if fn is None:
            handle = _call(self._hip, "hipModuleGetFunction", self.handle, name.encode())
            fn = self._functions[name] = HipFunction(self, name, handle)
        return fn

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle is not None:
            try:
                self._hip.hipModuleUnload(handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


class HipFunction:
    """One kernel of a loaded module; the same interface as CudaFunction."""

    def __init__(self, module: HipModule, name: str, handle):
        self.module = module
        self.name = name
        self.handle = handle
        self._dyn_smem_max = 0

    def _attr(self, which: str) -> int:
        hip = self.module._hip
        attr = getattr(hip.hipFunction_attribute, which)
        return int(_call(hip, "hipFuncGetAttribute", attr, self.handle))

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """AMD needs no opt-in for large dynamic LDS (hipFuncSetAttribute wants a
        host-side function, not a module's): check ``nbytes`` against the
        device's per-block LDS limit instead, so a too-large request fails here
        and not as a launch error."""
        limit = _device_attr("hipDeviceAttributeMaxSharedMemoryPerBlock")
        static = self._attr("HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES")
        if nbytes + static > limit:
            raise ValueError(
                f"{self.name}: {nbytes} bytes of dynamic LDS plus {static} static exceed the "
                f"device's {limit} bytes per block"
            )
        self._dyn_smem_max = int(nbytes)

    def attributes(self) -> dict[str, int]:
        return {
            "num_regs": self._attr("HIP_FUNC_ATTRIBUTE_NUM_REGS"),
            "shared_size_bytes": self._attr("HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
            "local_size_bytes": self._attr("HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
            "max_threads_per_block": self._attr("HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
        }

    def max_active_blocks_per_sm(self, threads: int, dyn_smem: int) -> int:
        return int(
            _call(
                self.module._hip,
                "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
                self.handle,
                int(threads),
                int(dyn_smem),
            )
        )

    def max_cooperative_grid(self, threads: int, dyn_smem: int) -> int:
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
        """As CudaFunction.launch; ``stream`` is a raw hipStream_t as an int
        (``torch.cuda.current_stream().cuda_stream`` on ROCm PyTorch), 0 the
        default stream. Arguments go through ``kernelParams`` (an array of
        pointers to each value), which HIP lays out from the kernel's metadata.
        ``pdl``: HIP has no programmatic dependent launch; True is refused."""
        self.prepare(grid, block, dyn_smem, args, cooperative, pdl)(stream)

    def prepare(self, grid: int | Sequence[int], block: int | Sequence[int], dyn_smem: int,
                args: Sequence[tuple[str, int | float]], cooperative: bool = False, pdl: bool = False) -> "HipLaunch":
        """As CudaFunction.prepare: ``launch`` checked and packed once, its calls take the stream."""
        if pdl:
            raise ValueError("HIP has no programmatic dependent launch: launch with pdl=False")
        return HipLaunch(self, _dim3(grid, "grid"), _dim3(block, "block"), int(dyn_smem), KernelParams(args),
                         cooperative)


class HipLaunch:
    """One launch of a HipFunction, prepared (``HipFunction.prepare``): its dimensions and
    packed arguments; each call takes the stream."""

    def __init__(self, fn: HipFunction, grid: tuple[int, int, int], block: tuple[int, int, int], dyn_smem: int,
                 params: KernelParams, cooperative: bool):
        self.fn, self.grid, self.block, self.dyn_smem = fn, grid, block, dyn_smem
        self.params, self.cooperative = params, cooperative
        # hip-python takes kernelParams as a list of the values' addresses
        self._pointers = list(params.pointers) or None

    def __call__(self, stream: int) -> None:
        ensure_device()
        shape = (*self.grid, *self.block, self.dyn_smem, None if int(stream) == 0 else int(stream))
        if self.cooperative:
            _call(self.fn.module._hip, "hipModuleLaunchCooperativeKernel", self.fn.handle, *shape, self._pointers)
        else:
            _call(self.fn.module._hip, "hipModuleLaunchKernel", self.fn.handle, *shape, self._pointers, None)
