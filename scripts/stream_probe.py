"""How fast can one launch stream a GEMV's weights into the SMs? (GPU, sm90)

The MiniMax qkv GEMV streams 15.7 MB of FP8 weight, ~119 KB per SM; the kernel's
timeline shows it landing at ~2 TB/s. This probe times the stream alone, replayed
from a CUDA graph over rotating cold copies (as the bench does), for ways to issue
it: an empty launch (the fixed cost of one cooperative launch in a graph), TMA bulk
copies into LDS in 1..N pieces per CTA, and plain 16-byte loads into registers.
Prints us per call and the bytes / time as TB/s.

Usage: python scripts/stream_probe.py [total_bytes]"""

import sys

import torch

from bench.run import auto_copies
from bench.timing import GpuTimer
from codegen.jit import cuda
from codegen.targets import get_target

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
__device__ u32 lds_address(const void* p) { return u32(__cvta_generic_to_shared(p)); }
extern "C" __global__ void __launch_bounds__(512, 1) empty(const char* w, long long bytes, u32* sink) {
    if (threadIdx.x == 0 && bytes < 0) sink[blockIdx.x] = 1;
}
// each CTA: its contiguous share of w, in `pieces` bulk copies, all issued at once
extern "C" __global__ void __launch_bounds__(512, 1) bulk(const char* w, long long bytes, u32* sink, int pieces) {
    extern __shared__ __align__(128) unsigned char lds[];
    u64* bar = reinterpret_cast<u64*>(lds);
    unsigned char* buf = lds + 128;
    const long long share = (bytes / gridDim.x) & ~15ll;
    const char* src = w + share * blockIdx.x;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(lds_address(bar)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(lds_address(bar)), "r"(u32(share)) : "memory");
        long long off = 0;
        for (int p = 0; p < pieces; ++p) {
            long long n = ((share * (p + 1) / pieces) & ~15ll) - off;
            if (p == pieces - 1) n = share - off;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(lds_address(buf + off)), "l"(src + off), "r"(u32(n)), "r"(lds_address(bar)) : "memory");
            off += n;
        }
    }
    __syncthreads();
    u32 done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(lds_address(bar)) : "memory");
    if (threadIdx.x == 0 && buf[5] == 0x7f && bytes < 0) sink[blockIdx.x] = 1;
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(lds_address(bar)) : "memory");
}
// each CTA: its share as 16-byte loads, coalesced, `pieces` loads in flight per thread
extern "C" __global__ void __launch_bounds__(512, 1) loads(const char* w, long long bytes, u32* sink, int pieces) {
    const long long share = (bytes / gridDim.x) & ~15ll;
    const char* src = w + share * blockIdx.x;
    u32 x = 0;
    for (long long off = 16 * threadIdx.x; off < share; off += 16ll * 512 * 8) {
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const long long o = off + 16ll * 512 * i;
            if (o < share) asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                                        : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w) : "l"(src + o));
            else v[i] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) x ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    }
    if (x == 0x12345678u) sink[blockIdx.x] = x;
}
"""


def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 2560 * 6144
    target = get_target("sm90")
    mod = cuda.CudaModule(cuda.compile(SOURCE, "stream_probe.cu", target))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copies = auto_copies(torch.cuda.get_device_properties(0).L2_cache_size, total)
    ws = [torch.randint(0, 255, (total,), dtype=torch.uint8, device="cuda") for _ in range(copies)]
    sink = torch.zeros(4 * sms, dtype=torch.int32, device="cuda")
    timer = GpuTimer(replays=30)
    share = (total // sms) & ~15
    lds = 128 + share
    print(f"{total} B over {sms} CTAs ({share} B each), {copies} cold copies; us per call (median of 30 graph replays)")

    def time(name, fn, grid, threads, dyn, cooperative, extra=()):
        f = mod.function(fn)
        f.set_max_dynamic_shared(max(dyn, 1))
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

        def call(w):
            args = [("u64", w.data_ptr()), ("i64", total), ("u64", sink.data_ptr())] + [("i32", v) for v in extra]
            f.launch(grid, threads, dyn, stream(), args, cooperative=cooperative)

        s = timer.graph([lambda w=w: call(w) for w in ws])
        us = sorted(s.us)[len(s.us) // 2]
        print(f"  {name:44s} {us:7.2f} us  {total / us / 1e6:6.2f} TB/s")

    time("empty, cooperative, 142 KB LDS", "empty", sms, 512, 142128, True)
    time("empty, plain launch, 142 KB LDS", "empty", sms, 512, 142128, False)
    time("empty, cooperative, no LDS", "empty", sms, 512, 0, True)
    for pieces in (1, 2, 4, 8, 16, 32):
        time(f"bulk copies, {pieces} per CTA, cooperative", "bulk", sms, 512, lds, True, (pieces,))
    time("bulk copies, 8 per CTA, 2 CTAs per SM", "bulk", 2 * sms, 512, 128 + (total // (2 * sms) & ~15), True, (8,))
    time("16-byte loads, 8 in flight per thread", "loads", sms, 512, 0, True, (8,))
    time("16-byte loads, 2 CTAs per SM", "loads", 2 * sms, 512, 0, True, (8,))


if __name__ == "__main__":
    main()
