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

__all__ = ["preshuffle", "unshuffle", "preshuffled_offset", "preshuffle_mx", "unshuffle_mx", "preshuffled_mx_offset"]

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


# ---- MXFP8 weights (DeepSeek-V4.1): every MMA covers exactly one 32-k scale block --------
#
# * sm90: the layout above. A 32-k chunk is one MX block already.
# * AMD (ours): one 16-byte load of lane l = (kq = l // 16, row l % 16) holds 8 k of each of
#   the two blocks of a 64-k chunk, one v_mfma_f32_16x16x32_fp8_fp8 operand each::
#
#       addr = (n//16)*16K + (k//64)*1024 + ((k%32)//8)*256 + (n%16)*16 + ((k%64)//32)*8 + (k%8)
#
#   view [G, n16, C64, kb2, kq4, k8] -> [G, C64, kq4, n16, kb2, k8].
_AMD_MX_PERM = (0, 2, 4, 1, 3, 5)


def _mx_factored(n: int, k: int) -> tuple[int, ...]:
    return (n // 16, 16, k // 64, 2, 4, 8)


def preshuffle_mx(w: torch.Tensor, target: Target | str) -> torch.Tensor:
    """Logical ``[N, K]`` MXFP8 weight -> the byte order the target's
    ``mx_gemv16_partial`` reads (sm90: :func:`preshuffle`'s; AMD: the layout
    above), as ``[N, K]`` of ``w``'s dtype. Only permutes bytes."""
    t = _target(target)
    if t.vendor != "amd":
        return preshuffle(w, t)
    n, k = _check(w, "preshuffle_mx")
    u = w.contiguous().view(torch.uint8)
    out = u.reshape(_mx_factored(n, k)).permute(_AMD_MX_PERM).contiguous()
    return out.reshape(n, k).view(w.dtype)


def unshuffle_mx(ws: torch.Tensor, target: Target | str) -> torch.Tensor:
    """Inverse of :func:`preshuffle_mx`."""
    t = _target(target)
    if t.vendor != "amd":
        return unshuffle(ws, t)
    n, k = _check(ws, "unshuffle_mx")
    shape = _mx_factored(n, k)
    permuted = tuple(shape[p] for p in _AMD_MX_PERM)
    inv = tuple(_AMD_MX_PERM.index(i) for i in range(len(_AMD_MX_PERM)))
    out = ws.contiguous().view(torch.uint8).reshape(permuted).permute(inv).contiguous()
    return out.reshape(n, k).view(ws.dtype)


def preshuffled_mx_offset(n: int, k: int, K: int, target: Target | str) -> int:
    """Byte offset of logical ``W[n, k]`` in :func:`preshuffle_mx`'s buffer."""
    t = _target(target)
    if t.vendor != "amd":
        return preshuffled_offset(n, k, K, t)
    return (n // 16) * (16 * K) + (k // 64) * 1024 + ((k % 32) // 8) * 256 + (n % 16) * 16 + ((k % 64) // 32) * 8 + (k % 8)
