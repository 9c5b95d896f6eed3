"""On an sm90 GPU: what limits the emulated fp8 MMAs of gemv_mxfp8? Throughput of each
instruction mix, measured with clock64 on every SM (132 CTAs x 16 warps, 8 independent
chains a thread), in SM cycles per warp instruction of the mix:

  f2fp      cvt.rn.f16x2.e4m3x2 (F2FP: two e4m3 -> f16x2), the emulation's unpack
  shuffle   the same two bytes -> f16x2 by integer ops (PRMT, shift, two LOP3; value 2^-8 x)
  mixed     half the chains each
  hmma      mma.sync m16n8k16 f16 -> f32 (HMMA.16816)
  mma_e4m3  mma.sync m16n8k32 e4m3 -> f32 (sm90: emulated by ptxas)

Usage (the lent machine): python3 scripts/probe_fp8_convert.py"""

from __future__ import annotations

import sys

import torch

from codegen.jit import cuda
from codegen.targets import get_target

ITERS = 256
CHAINS = 8

SOURCE = r"""
typedef unsigned int u32;
__device__ __forceinline__ u32 f2fp(u32 x) {
    u32 r;
    asm volatile("{\n.reg .b16 l;\nmov.b32 {l, _}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(r) : "r"(x));
    return r;
}
// bytes b0, b1 of x -> f16 halves (b & 0x80) << 8 | (b & 0x7f) << 7: the e4m3 value times 2^-8
__device__ __forceinline__ u32 shuffle(u32 x) {
    u32 t, r;
    asm volatile("prmt.b32 %0, %1, 0, 0x1404;" : "=r"(t) : "r"(x));
    r = ((t >> 1) & 0x3F803F80u) | (t & 0x80008000u);
    asm volatile("" : "+r"(r));
    return r;
}
#define TIMED(NAME, ...)                                                                             \
extern "C" __global__ void NAME(const u32* in, u32* out, int iters, long long* cycles) {             \
    u32 x[8];                                                                                        \
    for (int k = 0; k < 8; ++k) x[k] = in[(blockIdx.x * blockDim.x + threadIdx.x) * 8 + k];          \
    __syncthreads();                                                                                 \
    const long long t0 = clock64();                                                                  \
    for (int it = 0; it < iters; ++it) {                                                             \
        _Pragma("unroll") for (int k = 0; k < 8; ++k) { __VA_ARGS__ }                                      \
    }                                                                                                \
    __syncthreads();                                                                                 \
    const long long t1 = clock64();                                                                  \
    u32 s = 0;                                                                                       \
    for (int k = 0; k < 8; ++k) s ^= x[k];                                                           \
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;                                                  \
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;                                              \
}
TIMED(k_f2fp, x[k] = f2fp(x[k]);)
TIMED(k_shuffle, x[k] = shuffle(x[k]);)
TIMED(k_mixed, x[k] = k < 4 ? f2fp(x[k]) : shuffle(x[k]);)
// HMMA: chain k accumulates into its own C (x[k] feeds A so nothing is hoisted)
TIMED(k_hmma, {
    float d0 = __uint_as_float(x[k]), d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %4, %4, %4}, {%4, %4}, {%0, %1, %2, %3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(x[k]));
    x[k] = __float_as_uint(d0) ^ __float_as_uint(d3);
})
TIMED(k_mma_e4m3, {
    float d0 = __uint_as_float(x[k]), d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %4, %4, %4}, {%4, %4}, {%0, %1, %2, %3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(x[k]));
    x[k] = __float_as_uint(d0) ^ __float_as_uint(d3);
})
"""


def main() -> int:
    mod = cuda.CudaModule(cuda.compile(SOURCE, "probe_convert.cu", get_target("sm90")))
    blocks, threads = cuda.device_sm_count(), 512
    inp = torch.randint(0, 2**31 - 1, (blocks * threads * CHAINS,), dtype=torch.int32, device="cuda") & 0x3F3F3F3F
    out = torch.empty(blocks * threads, dtype=torch.int32, device="cuda")
    cycles = torch.zeros(blocks, dtype=torch.int64, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    warps = threads // 32
    print(f"{'mix':<10} {'SM cycles / warp instr':>24} {'lanes / SM cycle':>17}")
    for name in ("f2fp", "shuffle", "mixed", "hmma", "mma_e4m3"):
        fn = mod.function(f"k_{name}")
        for _ in range(2):  # the first launch warms up
            fn.launch(blocks, threads, 0, stream, [("u64", inp.data_ptr()), ("u64", out.data_ptr()), ("i32", ITERS),
                                                   ("u64", cycles.data_ptr())])
        torch.cuda.synchronize()
        per = cycles.double().median().item() / (warps * ITERS * CHAINS)
        print(f"{name:<10} {per:>24.3f} {32 / per:>17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
