"""MX weight preshuffle (codegen.weights.preshuffle_mx): a byte permutation
whose lane loads are exactly one MMA operand per 32-k scale block."""

from __future__ import annotations

import pytest
import torch

from codegen.weights import preshuffle, preshuffle_mx, preshuffled_mx_offset, unshuffle_mx


@pytest.mark.parametrize("target", ["sm90", "gfx942", "gfx950"])
def test_round_trip_and_offsets(target):
    n, k = 64, 256
    w = torch.randint(0, 256, (n, k), dtype=torch.uint8)
    ws = preshuffle_mx(w, target)
    assert ws.shape == w.shape and ws.dtype == w.dtype
    assert torch.equal(unshuffle_mx(ws, target), w)
    flat = ws.reshape(-1)
    for r in (0, 5, 17, 63):
        for c in (0, 9, 31, 32, 100, 255):
            assert flat[preshuffled_mx_offset(r, c, k, target)] == w[r, c]


def test_sm90_is_the_fp8_layout():
    w = torch.randint(0, 256, (32, 128), dtype=torch.uint8)
    assert torch.equal(preshuffle_mx(w, "sm90"), preshuffle(w, "sm90"))


def test_amd_lane_holds_one_mfma_operand_per_block():
    """Lane l's 16 bytes of 64-k chunk c: row l % 16, k 64c + 8(l // 16) + 0..7 (block 2c),
    then the same k + 32 (block 2c + 1)."""
    n, k = 16, 128
    r = torch.arange(n)[:, None].expand(n, k)
    kk = torch.arange(k)[None, :].expand(n, k)
    lanes_r = preshuffle_mx(r.to(torch.uint8), "gfx950").reshape(2, 64, 16)
    lanes_k = preshuffle_mx(kk.to(torch.uint8), "gfx950").reshape(2, 64, 16)
    for c in range(2):
        for lane in (0, 15, 16, 47, 63):
            assert (lanes_r[c, lane] == lane % 16).all()
            want = [64 * c + 8 * (lane // 16) + j for j in range(8)] + [64 * c + 32 + 8 * (lane // 16) + j for j in range(8)]
            assert lanes_k[c, lane].tolist() == want
