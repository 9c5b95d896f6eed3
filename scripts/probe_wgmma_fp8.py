"""On an sm90 GPU: is Hopper's native fp8 ``wgmma`` a drop-in for the emulated fp8 ``mma.sync``
that gemv_mxfp8 uses per 32-value MX block? Two questions, one launch each:

1. Layout: with A in registers laid out as ``mma.sync.m16n8k32``'s A fragment (warp w: rows
   16w ..; lane l = 4g + q: rows g, g + 8; k 4q .., 16 + 4q ..) and B (8 x 32, K-major) in
   shared memory as two 8-row x 16-byte core matrices (no swizzle; the descriptor's leading
   byte offset 128 from one to the next along K), does ``wgmma ... m64n8k32.f32.e4m3.e4m3``
   give the exact products on small integers (every sum exact)?
2. Rounding: on random e4m3 data, how far are one k32 block's ``d`` from the exact dot, for
   the native ``wgmma`` and the emulated ``mma.sync`` (F2FP + two f16 HMMA, today's path),
   as a fraction of absdot = sum |a b|? tests/deepseek_case.py allows 2^-22 of absdot.

Usage (the lent machine): python3 scripts/probe_wgmma_fp8.py"""

from __future__ import annotations

import math
import sys

import torch

from codegen.jit import cuda
from codegen.targets import get_target

SOURCE = r"""
typedef unsigned int u32; typedef unsigned long long u64;
// One warpgroup a CTA: trial blockIdx.x. a: 128 threads x 4 words (the mma.sync A fragment of
// each warp's 16 rows), b: 256 bytes of B (8 n x 32 k) in core-matrix order, d_wg / d_mma: the
// 128 threads' 4 results of wgmma and of mma.sync.
extern "C" __global__ void probe(const u32* a, const u32* b, const u32* bk, float* d_wg, float* d_mma, u64 lbo, u64 sbo) {
    __shared__ __align__(128) unsigned char bs[256];
    const int t = threadIdx.x, lane = t % 32, g = lane / 4, q = lane % 4;
    const long long base = (long long)blockIdx.x;
    if (t < 64) reinterpret_cast<u32*>(bs)[t] = b[base * 64 + t];
    __syncthreads();
    const u32 a0 = a[(base * 128 + t) * 4], a1 = a[(base * 128 + t) * 4 + 1];
    const u32 a2 = a[(base * 128 + t) * 4 + 2], a3 = a[(base * 128 + t) * 4 + 3];
    const u64 addr = (u64)__cvta_generic_to_shared(bs);
    const u64 desc = ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32);
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("wgmma.fence.sync.aligned;");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(0));
    asm volatile("wgmma.commit_group.sync.aligned;");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    float* o = d_wg + (base * 128 + t) * 4;
    o[0] = d0; o[1] = d1; o[2] = d2; o[3] = d3;
    // the emulated path: B fragment of column g, k 4q .. and 16 + 4q .. (bk: K-major rows of 32 bytes)
    const u32 b0 = bk[base * 64 + g * 8 + q], b1 = bk[base * 64 + g * 8 + 4 + q];
    float e0 = 0.f, e1 = 0.f, e2 = 0.f, e3 = 0.f;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(e0), "+f"(e1), "+f"(e2), "+f"(e3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    float* m = d_mma + (base * 128 + t) * 4;
    m[0] = e0; m[1] = e1; m[2] = e2; m[3] = e3;
}
"""


def a_fragments(a: torch.Tensor) -> torch.Tensor:
    """[T, 64, 32] e4m3 -> [T, 128, 4] words: thread 32w + 4g + q holds rows 16w + g / + 8, k 4q / 16 + 4q."""
    t = a.shape[0]
    u8 = a.view(torch.uint8).reshape(t, 4, 2, 8, 2, 4, 4)  # [T, w, row half h, g, k half kh, q, byte]
    # word r of the fragment: r = 2 kh + h (reg0: row g k lo, reg1: row g+8 k lo, reg2: row g k hi, reg3: g+8 hi)
    frag = u8.permute(0, 1, 3, 5, 4, 2, 6).reshape(t, 128, 4, 4)  # [T, thread, (kh, h), byte]
    return frag.contiguous().view(torch.int32).reshape(t, 128, 4)


def b_core(b: torch.Tensor) -> torch.Tensor:
    """[T, 8, 32] (n, k) e4m3 -> [T, 256] bytes: core matrix kc (k 16kc ..) at 128 kc, row n at 16 n."""
    t = b.shape[0]
    return b.view(torch.uint8).reshape(t, 8, 2, 16).permute(0, 2, 1, 3).reshape(t, 256).contiguous()


def d_layout(d: torch.Tensor) -> torch.Tensor:
    """[T, 128, 4] results -> [T, 64, 8]: thread 32w + 4g + q: (row g, col 2q, 2q + 1), (row g + 8, ..)."""
    t = d.shape[0]
    x = d.reshape(t, 4, 8, 4, 2, 2)  # [T, w, g, q, h, c]
    return x.permute(0, 1, 4, 2, 3, 5).reshape(t, 64, 8)


def run(a: torch.Tensor, b: torch.Tensor, fn, lbo: int, sbo: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = a.shape[0]
    dev = "cuda"
    av = a_fragments(a).to(dev)
    bv = b_core(b).view(torch.int32).to(dev)
    bk = b.view(torch.uint8).reshape(t, 256).contiguous().view(torch.int32).to(dev)
    d_wg = torch.full((t, 128, 4), float("nan"), device=dev)
    d_mma = torch.full((t, 128, 4), float("nan"), device=dev)
    fn.launch(t, 128, 0, torch.cuda.current_stream().cuda_stream,
              [("u64", av.data_ptr()), ("u64", bv.data_ptr()), ("u64", bk.data_ptr()), ("u64", d_wg.data_ptr()),
               ("u64", d_mma.data_ptr()), ("u64", lbo), ("u64", sbo)])
    torch.cuda.synchronize()
    return d_layout(d_wg.cpu()), d_layout(d_mma.cpu())


def exact(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ad, bd = a.double(), b.double()
    return torch.einsum("tmk,tnk->tmn", ad, bd), torch.einsum("tmk,tnk->tmn", ad.abs(), bd.abs())


def main() -> int:
    fn = cuda.CudaModule(cuda.compile(SOURCE, "probe.cu", get_target("sm90"))).function("probe")
    g = torch.Generator().manual_seed(7)
    e4 = torch.float8_e4m3fn
    trials = 512
    # 1. layout: small integers, every sum exact
    a = torch.randint(-4, 5, (trials, 64, 32), generator=g).float().to(e4)
    b = torch.randint(-4, 5, (trials, 8, 32), generator=g).float().to(e4)
    want, _ = exact(a, b)
    wg, mma = run(a, b, fn, 128, 256)
    print(f"layout, small integers: wgmma == exact {(wg.double() == want).float().mean().item():.4f}, "
          f"mma.sync == exact {(mma.double() == want).float().mean().item():.4f}")
    # 2. rounding: random e4m3 (weights ~ randn * 1.5; activations over the whole range, as MX-quantized)
    cases = {
        "randn*1.5 x randn*1.5": (torch.randn(trials, 64, 32, generator=g) * 1.5, torch.randn(trials, 8, 32, generator=g) * 1.5),
        "randn*1.5 x mx-quant": (torch.randn(trials, 64, 32, generator=g) * 1.5, None),
    }
    print(f"\n{'data':<24} {'path':<9} {'max err/absdot':>15} {'log2':>7} {'exact frac':>11}")
    for name, (af, bf) in cases.items():
        if bf is None:  # a row of 32 quantized as MX does: amax -> 448
            raw = torch.randn(trials, 8, 32, generator=g) * torch.exp2(torch.randint(-6, 6, (trials, 8, 1), generator=g).float())
            bf = raw / raw.abs().amax(-1, keepdim=True) * 448.0
        a, b = af.clamp(-448, 448).to(e4), bf.clamp(-448, 448).to(e4)
        want, absdot = exact(a, b)
        wg, mma = run(a, b, fn, 128, 256)
        for path, got in (("wgmma", wg), ("mma.sync", mma)):
            rel = ((got.double() - want).abs() / absdot.clamp_min(1e-300)).max().item()
            frac = (got.double() == want.float().double()).float().mean().item()
            print(f"{name:<24} {path:<9} {rel:>15.3e} {math.log2(rel) if rel > 0 else -math.inf:>7.1f} {frac:>11.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
