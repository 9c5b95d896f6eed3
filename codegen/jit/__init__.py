"""Run-time compilation of generated kernels, and their loading and launch.

Public entry points:

* ``compile_binary(source, name, target, backend=None) -> bytes``: a CUBIN
  (nvrtc, backend "cuda") or an AMD code object (hiprtc, backend "hip"),
  cached on disk.
* ``resource_report(source, name, target) -> list[ResourceReport]``: registers,
  LDS, scratch, spills and matrix instructions of each kernel, with no GPU
  (clang for AMD, nvrtc + ptxas -v for NVIDIA), cached on disk.
* ``load_module(binary, target, backend=None)``: a ``CudaModule`` or
  ``HipModule``; ``.function(name)`` gives a kernel with ``launch``,
  ``attributes``, ``set_max_dynamic_shared``, ``max_active_blocks_per_sm``.

The backends import their Python bindings lazily: importing this package needs
neither cuda-python nor hip-python; a missing one raises ``BackendUnavailable``
when first used. The cache folder is ``$MONO_CACHE_DIR`` (default
``~/.cache/mono-codegen``)."""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Sequence

from . import cache
from .errors import BackendUnavailable, CompileError
from .offline import ResourceReport, compile_offline

__all__ = [
    "BackendUnavailable",
    "CompileError",
    "ResourceReport",
    "backend_for",
    "compile_binary",
    "compile_binary_cached",
    "load_module",
    "resource_report",
]

BACKENDS = ("cuda", "hip")


def backend_for(target, backend: str | None = None) -> str:
    """``backend`` if given (checked), else "cuda" for NVIDIA targets and "hip"
    for AMD ones."""
    if backend is None:
        if target.vendor == "nvidia":
            return "cuda"
        if target.vendor == "amd":
            return "hip"
        raise ValueError(f"no backend for vendor {target.vendor!r} of target {target.name!r}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "hip" and target.vendor == "nvidia":
        # HIP on NVIDIA is nvrtc underneath: the CUDA backend compiles the same source.
        raise ValueError(f"target {target.name} is NVIDIA: use backend='cuda' (HIP on NVIDIA is nvrtc)")
    if backend == "cuda" and target.vendor == "amd":
        raise ValueError(f"target {target.name} is AMD: the cuda backend cannot build for {target.arch}")
    return backend


def _backend_module(backend: str):
    if backend == "cuda":
        from . import cuda as mod
    else:
        from . import hip as mod
    return mod


def compile_binary_cached(
    source: str, name: str, target, backend: str | None = None, extra_options: Sequence[str] = ()
) -> tuple[bytes, bool]:
    """``compile_binary`` and whether the binary came from the cache."""
    backend = backend_for(target, backend)
    mod = _backend_module(backend)
    parts = {
        "kind": "binary",
        "backend": backend,
        "source": source,
        "options": mod.options(target, extra_options),
        "compiler": mod.compiler_version(),
        "arch": target.arch,
        "name": name,
    }
    return cache.get_or_build(parts, lambda: mod.compile(source, name, target, extra_options))


def compile_binary(
    source: str, name: str, target, backend: str | None = None, extra_options: Sequence[str] = ()
) -> bytes:
    """The loadable binary of ``source`` for ``target``: a CUBIN for NVIDIA
    (nvrtc), a code object for AMD (hiprtc), from the disk cache when it holds
    one. ``name`` is the file name compile errors are reported under.
    CompileError if the source does not compile; BackendUnavailable if the
    backend's compiler is not installed."""
    return compile_binary_cached(source, name, target, backend, extra_options)[0]


def resource_report(
    source: str, name: str, target, extra_options: Sequence[str] = ()
) -> list[ResourceReport]:
    """The ResourceReport of each kernel in ``source`` for ``target``, compiled
    here with no GPU (cached)."""
    return compile_offline(source, name, target, extra_options)


def process_device(target, backend: str | None = None) -> int:
    """The GPU this process's modules load and launch on: PyTorch's current device when the
    backend first touched the GPU, fixed for the process's life (a binary loads once a
    process, in that device's context)."""
    return _backend_module(backend_for(target, backend)).process_device()


_loaded: dict[tuple[str, str], Any] = {}
_loaded_lock = threading.Lock()


def load_module(binary: bytes, target, backend: str | None = None) -> Any:
    """``binary`` (from ``compile_binary``) loaded on PyTorch's current device:
    a ``CudaModule`` or ``HipModule``. The same bytes load once per process;
    later calls return the module already loaded."""
    backend = backend_for(target, backend)
    k = (backend, hashlib.sha256(binary).hexdigest())
    with _loaded_lock:
        mod = _loaded.get(k)
        if mod is None:
            if backend == "cuda":
                from .cuda import CudaModule

                mod = CudaModule(binary)
            else:
                from .hip import HipModule

                mod = HipModule(binary)
            _loaded[k] = mod
        return mod
