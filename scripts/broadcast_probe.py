"""How long do 132 CTAs take to copy the same few KB from L2 into LDS? (GPU, sm90)

DeepSeek's wq_b CTAs each copy every token's QX8 row (20 KB at S = 16, 61 KB at S = 48),
just written by the qkv CTAs, into LDS; the kernel's timeline puts 2.3 / 4.6 us between the
rows' flags and the rows in LDS (bench/NOTES.md, session 15). This probe times that copy
alone: a `fill` launch writes the rows (so that they sit in L2, dirty, as in the kernel), then
every CTA of one launch copies them, stamping %globaltimer before and after. Ways: 16-byte
loads (all of a thread's in flight, then the LDS stores), or one TMA bulk copy; or 16-byte loads in the order of the
kernel's wgmma rows ("sectors": two lanes a 32-byte sector of one token, 16 tokens a load) or
in row order ("rows"), stored as wgmma's core matrices (the kernel's), linearly, or in the
128-byte-swizzled K-major layout (token t's 128-byte K segment s in 8-token atoms of 1024
bytes, 16-byte chunk j at j ^ t % 8); every CTA the
same bytes (a broadcast) or its own (no sharing), all at once or staggered like the kernel's
flags. Prints per CTA copy time, median / max over CTAs, each the median of 20 launches.

Usage: python scripts/broadcast_probe.py"""

import torch

from codegen.jit import cuda
from codegen.targets import get_target

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
__device__ u32 lds_address(const void* p) { return u32(__cvta_generic_to_shared(p)); }
__device__ u64 now() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
extern "C" __global__ void fill(unsigned char* buf, long long bytes, u32 seed) {
    for (long long i = (blockIdx.x * 512ll + threadIdx.x) * 4; i < bytes; i += gridDim.x * 512ll * 4)
        *reinterpret_cast<u32*>(buf + i) = u32(i) * 2654435761u + seed;
}
// mode 0: 16-byte loads, every load of a thread in flight before its LDS stores; 1: one TMA bulk
// copy; stagger_ns: CTA b starts b * stagger_ns / gridDim.x ns late (the kernel's flags spread)
extern "C" __global__ void __launch_bounds__(512, 1) copy(const unsigned char* src, long long bytes, long long cta_stride,
                                                          long long* tl, int mode, int stagger_ns) {
    extern __shared__ __align__(128) unsigned char lds[];
    u64* bar = reinterpret_cast<u64*>(lds);
    unsigned char* buf = lds + 128;
    src += cta_stride * blockIdx.x;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(lds_address(bar)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const u64 wait = now() + u64(stagger_ns) * blockIdx.x / gridDim.x;
    while (now() < wait) {}
    __syncthreads();
    const u64 t0 = now();
    if (mode >= 2) {  // 16-byte loads in row order or the wgmma rows' order, stores in one of three layouts
        const int nt = int(bytes / 1280), n = int(bytes / 16), ng = (nt + 7) / 8;
        const bool rows = mode == 3 || mode == 5;  // else: lanes 2j, 2j + 1 the 32-byte sector (c, token j % nt)
        auto token = [&](int it) { return rows ? it / 80 : (it / 2) % nt; };
        auto piece = [&](int it) { return rows ? it % 80 : 2 * (it / (2 * nt)) + it % 2; };
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int it = threadIdx.x + 512 * i;
            if (it < n)
                asm volatile("ld.relaxed.gpu.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w)
                             : "l"(src + 1280 * token(it) + 16 * piece(it)) : "memory");
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int it = threadIdx.x + 512 * i, t = token(it), p = piece(it);
            int at;
            if (mode == 2 || mode == 5) at = (((p / 2) * ng + t / 8) * 2 + p % 2) * 128 + (t % 8) * 16;  // core matrices
            else if (mode == 3) at = ((p / 8) * ng + t / 8) * 1024 + (t % 8) * 128 + ((p % 8) ^ (t % 8)) * 16;  // 128B swizzle
            else at = 16 * it;  // mode 4: linear
            if (it < n) *reinterpret_cast<uint4*>(buf + at) = v[i];
        }
        __syncthreads();
    } else if (mode == 0) {
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const long long o = 16ll * (threadIdx.x + 512 * i);
            if (o < bytes)
                asm volatile("ld.relaxed.gpu.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w) : "l"(src + o) : "memory");
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const long long o = 16ll * (threadIdx.x + 512 * i);
            if (o < bytes) *reinterpret_cast<uint4*>(buf + o) = v[i];
        }
        __syncthreads();
    } else {
        if (threadIdx.x == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(lds_address(bar)), "r"(u32(bytes)) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(lds_address(buf)), "l"(src), "r"(u32(bytes)), "r"(lds_address(bar)) : "memory");
        }
        u32 done = 0;
        while (!done)
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done) : "r"(lds_address(bar)) : "memory");
        __syncthreads();
    }
    const u64 t1 = now();
    if (threadIdx.x == 0) {
        tl[2 * blockIdx.x] = (long long)t0;
        tl[2 * blockIdx.x + 1] = (long long)t1;
        asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(lds_address(bar)) : "memory");
    }
    if (buf[threadIdx.x] == 0x5a && bytes < 0) tl[0] = 0;  // keep the stores
}
"""


def main() -> None:
    mod = cuda.CudaModule(cuda.compile(SOURCE, "broadcast_probe.cu", get_target("sm90")))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fill, copy = mod.function("fill"), mod.function("copy")
    stream = torch.cuda.current_stream().cuda_stream
    buf = torch.empty(sms * 65536 + 65536, dtype=torch.uint8, device="cuda")
    tl = torch.zeros(2 * sms, dtype=torch.int64, device="cuda")
    print(f"{sms} CTAs of 512 threads copy from L2 (just written) into LDS; us per CTA, median / max over CTAs "
          "(median of 20 launches); t_end: the last CTA done after the first one's start")
    for nbytes in (20480, 61440):
        copy.set_max_dynamic_shared(128 + nbytes)
        for mode, how in ((0, "16-byte loads"), (2, "sectors -> core"), (4, "sectors -> linear"), (5, "rows -> core"), (3, "rows -> swizzle128"), (1, "one TMA bulk copy")):
            for stride, what in ((0, "same bytes"), (nbytes, "own bytes")):
                for stagger in (0, 1500):
                    rows = []
                    for rep in range(22):
                        fill.launch(sms, 512, 0, stream, [("u64", buf.data_ptr()), ("i64", buf.numel()), ("u32", rep)])
                        copy.launch(sms, 512, 128 + nbytes, stream,
                                    [("u64", buf.data_ptr()), ("i64", nbytes), ("i64", stride), ("u64", tl.data_ptr()),
                                     ("i32", mode), ("i32", stagger)], cooperative=True)
                        t = tl.view(sms, 2).cpu().double()
                        if rep >= 2:
                            d = (t[:, 1] - t[:, 0]) / 1e3
                            rows.append((float(d.median()), float(d.max()), float((t[:, 1].max() - t[:, 0].min()) / 1e3)))
                    med = torch.tensor(rows).median(dim=0).values.tolist()
                    print(f"  {nbytes // 1024:3d} KB  {how:20s} {what:10s} stagger {stagger / 1e3:3.1f} us:"
                          f"  {med[0]:5.2f} / {med[1]:5.2f}   t_end {med[2]:5.2f}")


if __name__ == "__main__":
    main()
