"""Kernel launch arguments shared by the CUDA and HIP backends: ``(ctype,
value)`` pairs checked and turned into ctypes values, and the ``void**`` array
of their addresses that both drivers' launch calls take."""

from __future__ import annotations

import ctypes
import operator
from typing import Any, Sequence

# kernel argument kinds -> the ctypes type whose bytes the kernel parameter holds
ARG_CTYPES: dict[str, Any] = {
    "u64": ctypes.c_uint64,
    "i64": ctypes.c_int64,
    "u32": ctypes.c_uint32,
    "i32": ctypes.c_int32,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}
_INT_RANGES = {
    "u64": (0, 2**64 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u32": (0, 2**32 - 1),
    "i32": (-(2**31), 2**31 - 1),
}


def pack_args(args: Sequence[tuple[str, int | float]]) -> tuple[tuple, tuple]:
    """``args`` as the ``(values, ctypes types)`` pair of tuples that
    ``cuLaunchKernel``'s ``kernelParams`` takes (both must be tuples; lists
    are refused). Values become ctypes instances of their types, after range
    checks: a wrong width would silently shift every later parameter."""
    values: list[Any] = []
    types: list[Any] = []
    for i, arg in enumerate(args):
        try:
            kind, value = arg
        except (TypeError, ValueError):
            raise TypeError(f"kernel argument {i}: expected (ctype, value), got {arg!r}") from None
        ct = ARG_CTYPES.get(kind)
        if ct is None:
            raise TypeError(f"kernel argument {i}: unknown ctype {kind!r}; expected one of {', '.join(ARG_CTYPES)}")
        if kind in _INT_RANGES:
            if isinstance(value, bool) or not isinstance(value, int):
                try:
                    value = int(value.__index__())  # numpy ints, torch-free ints
                except (AttributeError, TypeError):
                    raise TypeError(f"kernel argument {i} ({kind}): expected an int, got {type(value).__name__}") from None
            lo, hi = _INT_RANGES[kind]
            if not lo <= value <= hi:
                raise OverflowError(f"kernel argument {i} ({kind}): {value} is out of range [{lo}, {hi}]")
        else:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    raise TypeError(f"kernel argument {i} ({kind}): expected a float, got {type(value).__name__}") from None
        values.append(ct(value))
        types.append(ct)
    return tuple(values), tuple(types)


class KernelParams:
    """``args`` packed once (``pack_args``) into the ``void**`` array a launch call's
    ``kernelParams`` is: ``values`` and ``pointers`` live as long as this object, so a
    prepared launch passes the same array call after call (the driver copies the values
    at each launch, and a graph capture into its node)."""

    def __init__(self, args: Sequence[tuple[str, int | float]]):
        self.values, self.types = pack_args(args)
        self.pointers = (ctypes.c_void_p * len(self.values))(*(ctypes.addressof(v) for v in self.values))

    @property
    def address(self) -> int | None:
        """The array's address (None, a NULL ``kernelParams``, for a kernel with no parameters)."""
        return ctypes.addressof(self.pointers) if self.values else None


def dim3(v: int | Sequence[int], what: str) -> tuple[int, int, int]:
    """``v`` (an int, or up to 3 ints) as the (x, y, z) of a grid or block."""
    if isinstance(v, (tuple, list)):
        dims = tuple(operator.index(x) for x in v) + (1,) * (3 - len(v))
    else:
        dims = (operator.index(v), 1, 1)
    if len(dims) != 3 or any(d < 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or up to 3 positive ints, got {v!r}")
    return dims  # type: ignore[return-value]
