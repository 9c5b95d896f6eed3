"""Preshuffle layouts (codegen.weights)."""

from __future__ import annotations

import pytest
import torch

from codegen.targets import TARGETS
from codegen.weights import preshuffle, preshuffled_offset, unshuffle

NAMES = list(TARGETS)


def _rand_bytes(n: int, k: int, seed: int, dtype=torch.uint8) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.int64).to(torch.uint8)
    return w.view(dtype)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.int8, torch.float8_e4m3fn, torch.float8_e4m3fnuz]
)
def test_round_trip(name, dtype):
    w = _rand_bytes(64, 384, seed=11, dtype=dtype)
    ws = preshuffle(w, TARGETS[name])
    assert ws.shape == w.shape and ws.dtype == dtype
    assert not torch.equal(ws.view(torch.uint8), w.view(torch.uint8))
    back = unshuffle(ws, name)
    assert back.dtype == dtype
    assert torch.equal(back.view(torch.uint8), w.view(torch.uint8))
    # a permutation of bytes
    assert torch.equal(
        torch.sort(ws.view(torch.uint8).flatten()).values,
        torch.sort(w.view(torch.uint8).flatten()).values,
    )


@pytest.mark.parametrize("name", NAMES)
def test_matches_offset_formula(name):
    n_rows, k = 48, 6144
    # distinct id per element (int32), then shuffle the 4 byte planes separately
    ids = torch.arange(n_rows * k, dtype=torch.int64).reshape(n_rows, k)
    flat = [preshuffle(((ids >> (8 * i)) & 0xFF).to(torch.uint8), name).flatten().long()
            for i in range(3)]
    got_id = flat[0] | (flat[1] << 8) | (flat[2] << 16)  # id at each shuffled address
    gen = torch.Generator().manual_seed(12)
    ns = torch.randint(0, n_rows, (2000,), generator=gen).tolist()
    ks = torch.randint(0, k, (2000,), generator=gen).tolist()
    for n, kk in zip(ns, ks):
        assert int(got_id[preshuffled_offset(n, kk, k, name)]) == n * k + kk
    # and the formula is a bijection onto [0, N*K): the full inverse agrees
    inv = torch.empty_like(got_id)
    inv[got_id] = torch.arange(got_id.numel())
    nn, kk = torch.meshgrid(torch.arange(n_rows), torch.arange(k), indexing="ij")
    if TARGETS[name].vendor == "amd":
        want = (nn // 16) * (16 * k) + (kk // 64) * 1024 + ((kk % 64) // 16) * 256 + (nn % 16) * 16 + kk % 16
    else:
        lane = (nn % 8) * 4 + (kk % 16) // 4
        reg = (nn % 16) // 8 + 2 * ((kk % 32) // 16)
        want = (nn // 16) * (16 * k) + (kk // 32) * 512 + lane * 16 + reg * 4 + kk % 4
    assert torch.equal(inv.reshape(n_rows, k), want)


def test_sm90_lane_fragments():
    """Each (16-row group, 32-k chunk) is one contiguous 512 B block; lane l's
    16 bytes there are its mma.sync.m16n8k32 A registers a0..a3."""
    n_rows, k = 32, 256
    w = _rand_bytes(n_rows, k, seed=13)
    ws = preshuffle(w, "sm90").flatten()
    for g in range(n_rows // 16):
        for c in range(k // 32):
            block = ws[g * 16 * k + c * 512: g * 16 * k + (c + 1) * 512]
            tile = w[16 * g: 16 * g + 16, 32 * c: 32 * c + 32]
            assert torch.equal(torch.sort(block).values, torch.sort(tile.flatten()).values)
            lanes = block.reshape(32, 4, 4)  # [lane, reg, byte]
            for lane in range(32):
                for r in range(4):
                    row = lane // 4 + 8 * (r % 2)
                    col = 4 * (lane % 4) + 16 * (r // 2)
                    assert torch.equal(lanes[lane, r], tile[row, col: col + 4])


@pytest.mark.parametrize("name", ["gfx942", "gfx950"])
def test_amd_lane_loads(name):
    """A.5.3: lane l of chunk kc loads row l%16, k = 64kc + 16(l//16) + [0,16)."""
    n_rows, k = 32, 384
    w = _rand_bytes(n_rows, k, seed=14)
    ws = preshuffle(w, name).flatten()
    for rg in range(n_rows // 16):
        for kc in range(k // 64):
            base = rg * 16 * k + kc * 1024
            loads = ws[base: base + 1024].reshape(64, 16)
            rows = torch.arange(64) % 16 + 16 * rg
            cols = 64 * kc + 16 * (torch.arange(64) // 16)[:, None] + torch.arange(16)[None, :]
            assert torch.equal(loads, w[rows[:, None], cols])


@pytest.mark.parametrize("shape", [(8, 64), (16, 32), (24, 128), (16, 96)])
def test_bad_shape(shape):
    w = torch.zeros(shape, dtype=torch.uint8)
    for fn in (preshuffle, unshuffle):
        with pytest.raises(ValueError, match=str(shape[0])):
            fn(w, "gfx942")


def test_bad_dtype_and_rank():
    with pytest.raises(ValueError):
        preshuffle(torch.ones(16, 64, dtype=torch.bfloat16), "sm90")
    with pytest.raises(ValueError):
        preshuffle(torch.ones(16 * 64, dtype=torch.uint8), "sm90")
