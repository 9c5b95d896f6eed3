"""The two errors the JIT raises: a compile failure that shows where in the
generated source it went wrong, and a backend whose runtime is not installed."""

from __future__ import annotations

import os
import re

# nvrtc / EDG:  ``name(LINE): error: ...``  (also ``catastrophic error``)
_NVRTC_LOC = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?:catastrophic )?error\b", re.M)
# clang:        ``name:LINE:COL: error: ...`` (also ``fatal error``)
_CLANG_LOC = re.compile(
    r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?:fatal )?error\b", re.M
)

CONTEXT_LINES = 3  # lines shown either side of an error's line
MAX_LOCATIONS = 10  # error locations excerpted; the log itself is always whole


def error_lines(log: str, source_name: str) -> list[int]:
    """The source lines (1-based, in order of appearance, no repeats) that the
    compiler ``log`` reports errors on in the file called ``source_name``.

    A location names the file as the compiler was given it; the match is on the
    name or its last path component, so ``/tmp/x/k.hip`` matches ``k.hip``."""
    want = {source_name, os.path.basename(source_name)}
    found: list[tuple[int, int]] = []  # (position in log, line)
    for rx in (_NVRTC_LOC, _CLANG_LOC):
        for m in rx.finditer(log):
            f = m.group("file").strip()
            if f in want or os.path.basename(f) in want:
                found.append((m.start(), int(m.group("line"))))
    out: list[int] = []
    for _, line in sorted(found):
        if line not in out:
            out.append(line)
    return out


def excerpt(source: str, line: int, context: int = CONTEXT_LINES) -> str:
    """Numbered lines ``line-context .. line+context`` of ``source``, the line
    itself marked with ``>``."""
    lines = source.splitlines()
    lo = max(1, line - context)
    hi = min(len(lines), line + context)
    width = len(str(hi))
    out = []
    for n in range(lo, hi + 1):
        mark = ">" if n == line else " "
        out.append(f"{mark} {n:>{width}} | {lines[n - 1]}")
    return "\n".join(out)


class CompileError(Exception):
    """A kernel source failed to compile.

    ``log`` is the compiler's whole output, ``source`` the text compiled and
    ``name`` the file name it was compiled under; ``str()`` gives the log and,
    for each error location in it, the source lines around it."""

    def __init__(self, log: str, source: str, name: str, compiler: str = ""):
        self.log = log
        self.source = source
        self.name = name
        self.compiler = compiler
        super().__init__(log)

    @property
    def lines(self) -> list[int]:
        """The lines of ``source`` the log reports errors on."""
        return error_lines(self.log, self.name)

    def __str__(self) -> str:
        head = f"compiling {self.name}"
        if self.compiler:
            head += f" with {self.compiler}"
        parts = [f"{head} failed:", self.log.rstrip()]
        nlines = len(self.source.splitlines())
        locs = [n for n in self.lines if 1 <= n <= nlines]
        for n in locs[:MAX_LOCATIONS]:
            parts.append(f"\n{self.name}:{n}:\n{excerpt(self.source, n)}")
        if len(locs) > MAX_LOCATIONS:
            parts.append(f"\n... and {len(locs) - MAX_LOCATIONS} more error locations")
        return "\n".join(parts)


class BackendUnavailable(RuntimeError):
    """A backend's runtime (hip-python and ROCm, cuda-python and the driver) is
    missing; the message says what and how to install it."""

    def __init__(self, backend: str, missing: str, hint: str = ""):
        self.backend = backend
        self.missing = missing
        self.hint = hint or _DEFAULT_HINTS.get(backend, "")
        msg = f"the {backend} backend is unavailable: {missing}"
        if self.hint:
            msg += f"\n  {self.hint}"
        super().__init__(msg)


_DEFAULT_HINTS = {
    "hip": (
        "install ROCm (libamdhip64.so and libhiprtc.so under $ROCM_PATH/lib, "
        "/opt/rocm by default) and the Python bindings: "
        "pip install 'mono-codegen[rocm]'"
    ),
    "cuda": (
        "install the NVIDIA driver and the Python bindings with nvrtc: "
        "pip install 'mono-codegen[cuda]'"
    ),
    "offline": (
        "install clang from PyPI: pip install ziglang"
    ),
}
