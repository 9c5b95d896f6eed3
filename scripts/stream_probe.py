"""How fast can one launch stream a GEMV's weights into the SMs? (GPU, sm90)

The MiniMax qkv GEMV streams 15.7 MB of FP8 weight, ~119 KB per SM; the kernel's
timeline shows it landing at ~2 TB/s. This probe times the stream alone, replayed
from a CUDA graph over rotating cold copies (as the bench does), for ways to issue
it: an empty launch (the fixed cost of one cooperative launch in a graph), TMA bulk
copies into LDS in 1..N pieces per CTA, and plain 16-byte loads into registers; each
also with programmatic dependent launch (PDL, as the kernels launch since session 24):
`griddepcontrol.launch_dependents` then `griddepcontrol.wait` before any load (the
kernels' order), or the weights read before the wait (they are constants: the most a
launch could overlap its predecessor). Prints us per call, the bytes / time as TB/s and
the time against the copy floor (bytes / the copy bandwidth measured in the same run).

--first: when a few CTAs' bytes land if the others ask later (first_probe).
--phase: when each CTA's first piece lands, its share streamed as two bulk copies as the
MiniMax GEMV's are (the first piece first), for several share sizes (phase_probe): whether the
CTAs that wait longest are those at one phase of an address period (their shares' offsets
c x share modulo P), as bench/NOTES.md MiniMax session 50 reads its GEMV's sawtooth.

Usage: python scripts/stream_probe.py [total_bytes] [--first | --phase]"""

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
// thread 0: the CTA's mbarrier, told the bytes its bulk copies will bring
__device__ void bar_init_expect(u64* bar, u32 bytes) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(lds_address(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(lds_address(bar)), "r"(bytes) : "memory");
}
__device__ void bulk_copy(unsigned char* dst, const char* src, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(lds_address(dst)), "l"(src), "r"(bytes), "r"(lds_address(bar)) : "memory");
}
__device__ void bar_wait(u64* bar) {  // every thread: until the bytes have landed
    u32 done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(lds_address(bar)) : "memory");
}
__device__ void bar_inval(u64* bar) { asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(lds_address(bar)) : "memory"); }
// pdl 1: let the next launch begin, then wait for the previous one, before any load (the kernels'
// order); pdl 2: the weights first, the wait after them. No-ops in a launch without the attribute.
__device__ void pdl_start(int pdl) {
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (pdl == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ void pdl_end(int pdl) {
    if (pdl == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
}
extern "C" __global__ void __launch_bounds__(512, 1) empty(const char* w, long long bytes, u32* sink, int pdl) {
    pdl_start(pdl);
    if (threadIdx.x == 0 && bytes < 0) sink[blockIdx.x] = 1;
}
// each CTA: its contiguous share of w, in `pieces` bulk copies, all issued at once
extern "C" __global__ void __launch_bounds__(512, 1) bulk(const char* w, long long bytes, u32* sink, int pieces, int pdl) {
    extern __shared__ __align__(128) unsigned char lds[];
    pdl_start(pdl);
    u64* bar = reinterpret_cast<u64*>(lds);
    unsigned char* buf = lds + 128;
    const long long share = (bytes / gridDim.x) & ~15ll;
    const char* src = w + share * blockIdx.x;
    if (threadIdx.x == 0) {
        bar_init_expect(bar, u32(share));
        long long off = 0;
        for (int p = 0; p < pieces; ++p) {
            long long n = ((share * (p + 1) / pieces) & ~15ll) - off;
            if (p == pieces - 1) n = share - off;
            bulk_copy(buf + off, src + off, u32(n), bar);
            off += n;
        }
    }
    __syncthreads();
    bar_wait(bar);
    pdl_end(pdl);
    if (threadIdx.x == 0 && buf[5] == 0x7f && bytes < 0) sink[blockIdx.x] = 1;
    __syncthreads();
    if (threadIdx.x == 0) bar_inval(bar);
}
// each CTA: its share as 16-byte loads, coalesced, `pieces` loads in flight per thread
extern "C" __global__ void __launch_bounds__(512, 1) loads(const char* w, long long bytes, u32* sink, int pieces, int pdl) {
    pdl_start(pdl);
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
    pdl_end(pdl);
    if (x == 0x12345678u) sink[blockIdx.x] = x;
}
__device__ long long globaltimer() {
    long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
// CTAs 0 .. first_ctas - 1 copy first_bytes each (one bulk copy, at once); the others their share
// of `bytes`, issued delay_ns after their start. Thread 0 stamps its start and when its copy landed
// (stamps[2 c], stamps[2 c + 1], ns): do a few CTAs' bytes land early if the rest ask later?
extern "C" __global__ void __launch_bounds__(512, 1) first(const char* w, long long bytes, long long* stamps,
                                                            int first_ctas, int first_bytes, int delay_ns) {
    extern __shared__ __align__(128) unsigned char lds[];
    u64* bar = reinterpret_cast<u64*>(lds);
    unsigned char* buf = lds + 128;
    const long long t0 = globaltimer();
    const int c = blockIdx.x, rest = gridDim.x - first_ctas;
    const long long share = (bytes / rest) & ~15ll;
    const bool early = c < first_ctas;
    const char* src = early ? w + share * rest + (long long)first_bytes * c : w + share * (c - first_ctas);
    const u32 n = early ? u32(first_bytes) : u32(share);
    if (threadIdx.x == 0) {
        if (!early)
            while (globaltimer() < t0 + delay_ns) {}
        bar_init_expect(bar, n);
        bulk_copy(buf, src, n, bar);
    }
    __syncthreads();
    bar_wait(bar);
    if (threadIdx.x == 0) {
        stamps[2 * c] = t0;
        stamps[2 * c + 1] = globaltimer();
        bar_inval(bar);
    }
}
// Each CTA: its share (share bytes at share x c) as two bulk copies on two mbarriers, issued at
// once by thread 0: the last first_bytes of the share first (where the GEMV's head piece lies),
// then the rest. Thread 0 stamps its start, the first piece landed, all landed (stamps[3 c ..]).
extern "C" __global__ void __launch_bounds__(512, 1) phase(const char* w, long long share, long long* stamps,
                                                            int first_bytes) {
    extern __shared__ __align__(128) unsigned char lds[];
    u64* bar = reinterpret_cast<u64*>(lds);
    unsigned char* buf = lds + 128;
    const long long t0 = globaltimer();
    const int c = blockIdx.x;
    const char* src = w + share * c;
    const u32 rest = u32(share) - u32(first_bytes);
    if (threadIdx.x == 0) {
        bar_init_expect(bar, u32(first_bytes));
        bar_init_expect(bar + 1, rest);
        bulk_copy(buf + rest, src + rest, u32(first_bytes), bar);
        bulk_copy(buf, src, rest, bar + 1);
    }
    __syncthreads();
    bar_wait(bar);
    const long long t1 = globaltimer();
    bar_wait(bar + 1);
    if (threadIdx.x == 0) {
        stamps[3 * c] = t0;
        stamps[3 * c + 1] = t1;
        stamps[3 * c + 2] = globaltimer();
        bar_inval(bar);
        bar_inval(bar + 1);
    }
}
"""

PERIODS_KB = (256, 320, 384, 512, 640, 768, 960, 1024, 1280, 1536, 1920, 2048)  # address periods --phase tries (5 active HBM stacks on an H100, 6 on an H200)
FIRST_PIECE = 91 * 512  # --phase: the first piece's bytes, a typical head piece of the MiniMax GEMV (91 chunks)


def phase_fit(late_us: torch.Tensor, share: int, offset: int = 0, periods_kb=PERIODS_KB) -> list[tuple[int, float]]:
    """For each period P (KB): how well the CTAs' waits ramp with the phase of their pieces'
    addresses ((c x share + offset) mod P) / P: the largest correlation over 16 places of the
    ramp's drop (a wait that rises with the phase and drops once a period reads near 1)."""
    c = torch.arange(len(late_us), dtype=torch.float64)
    out = []
    for kb in periods_kb:
        phase = torch.remainder(c * share + offset, kb * 1024) / (kb * 1024)
        best = max(float(torch.corrcoef(torch.stack([torch.remainder(phase - k / 16, 1.0), late_us.double()]))[0, 1])
                   for k in range(16))
        out.append((kb, best))
    return out


def phase_probe(mod, total: int, sms: int, rounds: int = 8) -> None:
    """--phase: when each CTA's first piece (46 KB at its share's end, where the GEMV's head piece
    lies) landed after the first CTA's start, per-CTA medians over `rounds` cold launches, for
    shares of 64 KB .. the MiniMax GEMV's ~119 KB, and each period's phase correlation."""
    f = mod.function("phase")
    stamps = torch.zeros(3 * sms, dtype=torch.int64, device="cuda")
    for share in (total // sms & ~15, 98304, 131072, 65536):
        copies = auto_copies(torch.cuda.get_device_properties(0).L2_cache_size, share * sms)
        ws = [torch.randint(0, 255, (share * sms,), dtype=torch.uint8, device="cuda") for _ in range(copies)]
        f.set_max_dynamic_shared(128 + share)
        firsts, alls = [], []
        for r in range(rounds * len(ws)):
            f.launch(sms, 512, 128 + share, torch.cuda.current_stream().cuda_stream,
                     [("u64", ws[r % len(ws)].data_ptr()), ("i64", share), ("u64", stamps.data_ptr()),
                      ("i32", FIRST_PIECE)], cooperative=True)
            if r % len(ws) == len(ws) - 1:  # a launch on a copy last read a rotation ago
                t = stamps.view(-1, 3).cpu()
                firsts.append((t[:, 1] - t[:, 0].min()).double() / 1e3)
                alls.append((t[:, 2] - t[:, 0].min()).double() / 1e3)
        torch.cuda.synchronize()
        first = torch.stack(firsts).median(0).values
        every = torch.stack(alls).median(0).values
        fits = phase_fit(first, share, offset=share - FIRST_PIECE)  # the first piece's address
        best = max(fits, key=lambda kr: kr[1])
        print(f"share {share} B x {sms} CTAs ({copies} copies): first piece landed {first.min():.2f} / "
              f"{first.median():.2f} / {first.max():.2f} us (min / median / max over the CTAs), all "
              f"{every.min():.2f} / {every.median():.2f} / {every.max():.2f}; best phase period {best[0]} KB "
              f"(correlation {best[1]:.2f}); by period: "
              + ", ".join(f"{kb} {r:.2f}" for kb, r in fits))
        print("  first piece by CTA: " + " ".join(f"{v:.1f}" for v in first.tolist()))


def first_probe(mod, total: int, sms: int, first_ctas: int = 8, first_bytes: int = 98304) -> None:
    """--first: when do first_ctas CTAs' first_bytes land if the other CTAs ask for their shares of
    the weight 0 / 1 / 2 / 3 us after they start (cold copies, the last of a rotation's launches)?
    The premise of running the index q's rows first (bench/NOTES.md, MiniMax session 21)."""
    extra = first_ctas * first_bytes
    copies = auto_copies(torch.cuda.get_device_properties(0).L2_cache_size, total + extra)
    ws = [torch.randint(0, 255, (total + extra,), dtype=torch.uint8, device="cuda") for _ in range(copies)]
    stamps = torch.zeros(2 * sms, dtype=torch.int64, device="cuda")
    f = mod.function("first")
    share = (total // (sms - first_ctas)) & ~15
    f.set_max_dynamic_shared(128 + max(share, first_bytes))
    print(f"{first_ctas} CTAs copy {first_bytes} B each first; the other {sms - first_ctas} {share} B each, "
          f"after a delay; us after the first CTA's start, median / max (cold, {copies} copies)")
    for delay in (0, 1000, 2000, 3000):
        for w in ws:  # the last launch's copy was last read a rotation ago
            f.launch(sms, 512, 128 + max(share, first_bytes), torch.cuda.current_stream().cuda_stream,
                     [("u64", w.data_ptr()), ("i64", total), ("u64", stamps.data_ptr()), ("i32", first_ctas),
                      ("i32", first_bytes), ("i32", delay)], cooperative=True)
        torch.cuda.synchronize()
        t = stamps.view(-1, 2).double().cpu()
        landed = (t[:, 1] - t[:, 0].min()) / 1e3
        a, b = landed[:first_ctas], landed[first_ctas:]
        print(f"  others ask {delay / 1e3:.0f} us later: first CTAs landed {a.median():6.2f} / {a.max():6.2f}, "
              f"the others {b.median():6.2f} / {b.max():6.2f}")


def main() -> None:
    sizes = [a for a in sys.argv[1:] if not a.startswith("--")]
    total = int(sizes[0]) if sizes else 2560 * 6144
    target = get_target("sm90")
    mod = cuda.CudaModule(cuda.compile(SOURCE, "stream_probe.cu", target))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copies = auto_copies(torch.cuda.get_device_properties(0).L2_cache_size, total)
    ws = [torch.randint(0, 255, (total,), dtype=torch.uint8, device="cuda") for _ in range(copies)]
    sink = torch.zeros(4 * sms, dtype=torch.int32, device="cuda")
    timer = GpuTimer(replays=30)
    share = (total // sms) & ~15
    lds = 128 + share
    if "--first" in sys.argv[1:]:
        first_probe(mod, total, sms)
        return
    if "--phase" in sys.argv[1:]:
        phase_probe(mod, total, sms)
        return
    bw = timer.copy_bandwidth()["bytes_per_s"]
    floor_us = total / bw * 1e6
    print(f"{total} B over {sms} CTAs ({share} B each), {copies} cold copies; copy bandwidth {bw / 1e12:.2f} TB/s, "
          f"floor {floor_us:.2f} us; us per call (median of 30 graph replays)")

    def time(name, fn, grid, threads, dyn, cooperative, pieces=None, pdl=0):
        f = mod.function(fn)
        f.set_max_dynamic_shared(max(dyn, 1))
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
        extra = ([] if pieces is None else [("i32", pieces)]) + [("i32", pdl)]

        def call(w):
            args = [("u64", w.data_ptr()), ("i64", total), ("u64", sink.data_ptr())] + extra
            f.launch(grid, threads, dyn, stream(), args, cooperative=cooperative, pdl=pdl > 0)

        s = timer.graph([lambda w=w: call(w) for w in ws])
        us = sorted(s.us)[len(s.us) // 2]
        print(f"  {name:58s} {us:7.2f} us  {total / us / 1e6:6.2f} TB/s  {us / floor_us:5.2f}x the floor")

    one_cta = 142128  # LDS that leaves one CTA an SM, as the kernels' 512 threads x 80-130 registers do
    wait_first, weights_first = "PDL, wait first", "PDL, weights before the wait"
    time("empty, cooperative, 142 KB LDS", "empty", sms, 512, one_cta, True)
    time(f"empty, cooperative, 142 KB LDS, {wait_first}", "empty", sms, 512, one_cta, True, pdl=1)
    time("empty, plain launch, 142 KB LDS", "empty", sms, 512, one_cta, False)
    time("empty, cooperative, no LDS", "empty", sms, 512, 0, True)
    for pieces in (1, 2, 4, 8, 16, 32):
        time(f"bulk copies, {pieces} per CTA, cooperative", "bulk", sms, 512, lds, True, pieces)
    time(f"bulk copies, 8 per CTA, cooperative, {wait_first}", "bulk", sms, 512, max(lds, one_cta), True, 8, pdl=1)
    time(f"bulk copies, 8 per CTA, cooperative, {weights_first}", "bulk", sms, 512, max(lds, one_cta), True, 8, pdl=2)
    time("bulk copies, 8 per CTA, 2 CTAs per SM", "bulk", 2 * sms, 512, 128 + (total // (2 * sms) & ~15), True, 8)
    time("16-byte loads, 8 in flight per thread", "loads", sms, 512, 0, True, 8)
    time("16-byte loads, 2 CTAs per SM", "loads", 2 * sms, 512, 0, True, 8)
    time(f"16-byte loads, 142 KB LDS, cooperative, {wait_first}", "loads", sms, 512, one_cta, True, 8, pdl=1)
    time(f"16-byte loads, 142 KB LDS, cooperative, {weights_first}", "loads", sms, 512, one_cta, True, 8, pdl=2)
    time(f"16-byte loads, no LDS, cooperative, {wait_first}", "loads", sms, 512, 0, True, 8, pdl=1)
    time(f"16-byte loads, no LDS, not cooperative, {weights_first}", "loads", sms, 512, 0, False, 8, pdl=2)

if __name__ == "__main__":
    main()
