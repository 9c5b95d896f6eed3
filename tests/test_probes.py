"""The sm90 probe scripts (scripts/probe_*.py, run on the lent H200): their CUDA sources
compile with nvrtc here, and the wgmma probe's fragment layouts are the mma.sync
m16n8k32 ones it claims (checked element by element on the CPU)."""

from __future__ import annotations

import torch

from codegen.jit import cuda
from codegen.targets import get_target
from scripts import probe_fp8_convert, probe_wgmma_fp8


def test_probe_sources_compile():
    for mod in (probe_wgmma_fp8, probe_fp8_convert):
        assert len(cuda.compile(mod.SOURCE, "probe.cu", get_target("sm90"))) > 1000


def test_wgmma_probe_layouts():
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, 256, (2, 64, 32), generator=g, dtype=torch.uint8)
    frag = probe_wgmma_fp8.a_fragments(a.view(torch.float8_e4m3fn)).view(torch.uint8).reshape(2, 128, 4, 4)
    for w in range(4):
        for lane in range(32):
            gr, q = lane // 4, lane % 4
            th = 32 * w + lane
            for reg, (row, k0) in enumerate(((gr, 4 * q), (gr + 8, 4 * q), (gr, 16 + 4 * q), (gr + 8, 16 + 4 * q))):
                assert torch.equal(frag[:, th, reg], a[:, 16 * w + row, k0:k0 + 4])
    b = torch.randint(0, 256, (2, 8, 32), generator=g, dtype=torch.uint8)
    core = probe_wgmma_fp8.b_core(b.view(torch.float8_e4m3fn))
    for n in range(8):
        for k in range(32):  # core matrix k // 16 at 128 B, row n at 16 B
            assert torch.equal(core[:, 128 * (k // 16) + 16 * n + k % 16], b[:, n, k])
    d = torch.arange(2 * 128 * 4, dtype=torch.float32).reshape(2, 128, 4)
    tile = probe_wgmma_fp8.d_layout(d)
    for th in (0, 5, 37, 127):
        w, gr, q = th // 32, th % 32 // 4, th % 4
        assert tile[1, 16 * w + gr, 2 * q].item() == d[1, th, 0].item()
        assert tile[1, 16 * w + gr + 8, 2 * q + 1].item() == d[1, th, 3].item()
