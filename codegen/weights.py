"""Weight preshuffle: the byte order in which a GEMV kernel reads an [N, K]
1-byte (FP8) weight so that each lane's operand is one 16-byte load.

Layouts (byte offset in the flat shuffled buffer of logical ``W[n, k]``;
both keep 16-row groups of ``16 * K`` bytes, group ``n // 16`` first):

* AMD (gfx942, gfx950), aiter's ``shuffle_weight(W, layout=(16, 16))``::

      addr = (n//16)*16K + (k//64)*1024 + ((k%64)//16)*256 + (n%16)*16 + (k%16)

  1 KiB per 64-k chunk; in a chunk 4 slabs of 256 B (k sub-block of 16), each
  slab 16 rows x 16 consecutive k. Lane ``l`` of a wave64 loads the 16 bytes
  at ``chunk + 16l`` = row ``l % 16``, k = ``16(l//16) + [0, 16)``.

* sm90 (ours), the A fragments of ``mma.sync.m16n8k32`` (e4m3, A = W rows)::

      lane = (n%8)*4 + (k%16)//4
      reg  = (n%16)//8 + 2*((k%32)//16)
      addr = (n//16)*16K + (k//32)*512 + lane*16 + reg*4 + (k%4)

  512 B per 32-k chunk; lane ``l`` loads the 16 bytes at ``chunk + 16l`` =
  its four A registers a0..a3 (4 bytes each, k ascending inside a register),
  register r holding row ``l//4 + 8(r%2)``, k = ``16(r//2) + 4(l%4) + [0, 4)``.

Both functions work on a uint8 view, keep the shape ``[N, K]`` and the dtype,
and only permute bytes (no rounding anywhere)."""

from __future__ import annotations

import torch

from codegen.targets import Target, get_target

__all__ = ["preshuffle", "unshuffle", "preshuffled_offset"]

# Byte-tensor views (logical [N, K] -> factored dims) and the permutation that
# orders the factored dims as they appear in the shuffled address, outermost
# first.
#   AMD : view [G, n16, C64, kb4, k16]                -> [G, C64, kb4, n16, k16]
#   sm90: view [G, nh2, nl8, C32, kh2, kq4, kr4]      -> [G, C32, nl8, kq4, kh2, nh2, kr4]
_AMD_PERM = (0, 2, 3, 1, 4)
_SM90_PERM = (0, 3, 2, 5, 4, 1, 6)


def _target(target: Target | str) -> Target:
    return get_target(target) if isinstance(target, str) else target


def _check(w: torch.Tensor, what: str) -> tuple[int, int]:
    if w.dim() != 2:
        raise ValueError(f"{what}: expected a 2-D [N, K] tensor, got shape {tuple(w.shape)}")
    if w.element_size() != 1:
        raise ValueError(f"{what}: expected a 1-byte dtype, got {w.dtype} (shape {tuple(w.shape)})")
    n, k = w.shape
    if n % 16 or k % 64:
        raise ValueError(
            f"{what}: shape [N, K] = {[n, k]} needs N % 16 == 0 and K % 64 == 0"
        )
    return n, k


def _factored_shape(n: int, k: int, t: Target) -> tuple[int, ...]:
    if t.vendor == "amd":
        return (n // 16, 16, k // 64, 4, 16)
    return (n // 16, 2, 8, k // 32, 2, 4, 4)


def _perm(t: Target) -> tuple[int, ...]:
    return _AMD_PERM if t.vendor == "amd" else _SM90_PERM


def preshuffle(w: torch.Tensor, target: Target | str) -> torch.Tensor:
    """Logical ``[N, K]`` weight -> the target's shuffled byte order (see the
    module docstring), returned as ``[N, K]`` of ``w``'s dtype whose flat
    bytes are the shuffled buffer."""
    t = _target(target)
    n, k = _check(w, "preshuffle")
    u = w.contiguous().view(torch.uint8)
    out = u.reshape(_factored_shape(n, k, t)).permute(_perm(t)).contiguous()
    return out.reshape(n, k).view(w.dtype)


def unshuffle(ws: torch.Tensor, target: Target | str) -> torch.Tensor:
    """Inverse of :func:`preshuffle`: shuffled ``[N, K]`` bytes -> the logical
    ``[N, K]`` weight, same dtype."""
    t = _target(target)
    n, k = _check(ws, "unshuffle")
    perm = _perm(t)
    shape = _factored_shape(n, k, t)
    permuted_shape = tuple(shape[p] for p in perm)
    inv = tuple(perm.index(i) for i in range(len(perm)))
    u = ws.contiguous().view(torch.uint8)
    out = u.reshape(permuted_shape).permute(inv).contiguous()
    return out.reshape(n, k).view(ws.dtype)


def preshuffled_offset(n: int, k: int, K: int, target: Target | str) -> int:
    """Byte offset of logical ``W[n, k]`` in the shuffled buffer of a
    ``[N, K]`` weight for ``target`` (the formulas of the module docstring)."""
    t = _target(target)
    if t.vendor == "amd":
        return (n // 16) * (16 * K) + (k // 64) * 1024 + ((k % 64) // 16) * 256 + (n % 16) * 16 + (k % 16)
    lane = (n % 8) * 4 + (k % 16) // 4
    reg = (n % 16) // 8 + 2 * ((k % 32) // 16)
    return (n // 16) * (16 * K) + (k // 32) * 512 + lane * 16 + reg * 4 + (k % 4)
