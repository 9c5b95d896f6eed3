"""Why DeepSeek's kernel read slower in a bench run with the torch.compile contender
(bench/NOTES.md: S = 6 / 16 up to 1.4 us above the same build timed by turns without it).
Times ours in ONE process, the bench's way (bench/timing.py), in the states a with-compile run
goes through. The answer (DeepSeek session 39): the SM's L1 / shared memory split. A kernel
that leaves its carveout to the driver runs in the split the previous kernel left, if its LDS
fits it; the eager chain's last kernels leave one split, the compiled chain's another. Since
then the spec sets it (grid.smem_carveout), so ``--steps carveout`` clears the preference
(-1) to show the old behaviour. Steps:

  states (default): plain (a case without the compiled chain), compiled (a case whose
    warm-up compiled and ran the chain), after (after the chain's timing), no-workers
    (inductor's compile workers shut down), emptied (torch.cuda.empty_cache()), plain-beside
    (a plain case built while the compiled one lives), compiled-again (a second compiled case
    of the same S: no compile), plain-again (a fresh plain case at the end)
  chain: in plain cases, ours before and after one run of the compiled chain (plain+chain),
    after cuCtxResetPersistingL2Cache (reset-l2: not it), after the chain's tensors are dropped
    (chain-dropped: not them), and in another case after ten runs of the eager chain
  timeline: a timeline build's stamps (the spec's split) in a plain case, after one run of the
    compiled chain, in a compiled case after its warm-up and after the compiled chain's timing
    (session 39, split unset: the step that moved was wqkv's partials reaching the qkv stage)
  carveout: for each preferred carveout of --carveouts (-1: none), ours after one run of the
    eager chain and after one of the compiled chain
  placement: where the CTAs land (a stand-in kernel of ours's grid, threads, LDS and carveout
    that writes each CTA's %smid, launched right after ours), ours's CTAs per SM, the L2
    persisting limit, and ours at each of --carveouts, in a compiled case after its warm-up and
    after each of two timings of the compiled chain
  evict: whether L2 lines of evict_last priority (inductor's Triton loads carry that hint) are
    the state: ours after --mibs MiB of a buffer loaded with an L2::evict_last cache policy,
    then after those lines are demoted (applypriority.global.L2::evict_normal); then, after the
    compiled chain's timing, ours after cuCtxResetPersistingL2Cache and after demoting every
    segment the caching allocator holds (the chain's weights and its graph's buffers among them)
  phase: whether the block scheduler's state is it: in a plain case, ours, then after each of
    eight one-CTA launches (each adds one, so the ninth timing follows eight)
  tunes: whether the slow state spares a tuned build: the spec's build in a compiled case and
    each of --tunes's builds beside it, timed after the warm-up and after each of --rounds
    timings of the compiled chain
  rebuild: which of the case's buffers carry the slow state: in a plain case, ours before and
    after one run of the compiled chain, then after each of these is replaced by fresh buffers in
    turn: the workspace (scratch and epoch counter: the mailboxes), the inputs and outputs, the
    weight copies; then once more after one run of the chain
  address: whether the workspace's address sets the state: in one plain case, ours with its
    workspace (mailboxes, partials, epoch counter) zeroed at each of --places places 1 MiB + 4 KiB
    apart in one pool, twice over in opposite orders (times that follow the place, not the pass,
    are the address's doing); then the scratch alone at each place (the counter apart), the
    counter alone (the scratch at the fastest place; its times also grouped by bits 20-22 of the
    counter's address), which SMs the counter's and the mailboxes' first lines are near at each
    place, by atomics and by loads (LINE_HOMES_SRC: an H100's L2 is two partitions; with ours's
    CTA -> SM map), how many of the partials' lines (up to 512) are at home in the qkv CTAs'
    partition at each place, the counter right after the scratch (one page) and on another page,
    and the timeline build's stamps at the fastest and the slowest place; --address-tunes: builds
    timed beside the spec's, in every pass but the timeline;
    --address-chains n: after the place passes, n times one run of the compiled chain and the
    place passes again (whether the chain changes what a place costs), and a case with the
    caching allocator's own workspace timed before and after each run
  pdl: whether the slow state outlives a drained SM: in a compiled case (the RESULTS run's
    order: warm-up, ours, the compiled chain's timing, ours again), ours with programmatic
    dependent launch, then without it (every launch after the previous one's end), then with it
    again, then after 3 s idle; the same in a plain case after the eager chain's timing. Each
    timing line starts with the wall time, to be read beside an ``nvidia-smi -lms`` log

Each timing line also prints the caching allocator's reserved / allocated MiB.

  python3 scripts/compile_offset_probe.py [--tokens 6,16] [--rounds 2] [--steps carveout --carveouts -1,100,0]"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.run import DeepSeekBench, auto_copies, device_meta, parse_args  # noqa: E402
import codegen  # noqa: E402
from bench.deepseek import KERNEL, WEIGHTS, weight_copies  # noqa: E402
from bench.timing import GpuTimer, warm_clocks  # noqa: E402
from codegen.rolemap import role_table  # noqa: E402
from codegen.trace import point_stats  # noqa: E402
from tests import deepseek_case as dc  # noqa: E402


# the timeline build's spare points: x rows in wqkv's LDS, the qkv stage's partials, QX8's first
# flags seen by wq_b, its rows in LDS (bench/NOTES.md DeepSeek session 28's steps)
SPARE_POINTS = {"wqkv_a.rows_point": "spare", "qkv.got_point": "spare2", "wq_b.flags_point": "spare3",
                "wq_b.rows_point": "spare4"}


def reset_persisting_l2() -> bool:
    """Demote every persisting (evict_last) line of the L2 to normal (cuCtxResetPersistingL2Cache)."""
    from cuda.bindings import driver
    torch.cuda.synchronize()
    (err,) = driver.cuCtxResetPersistingL2Cache()
    return err == driver.CUresult.CUDA_SUCCESS


L2_PRIORITY_SRC = r"""
extern "C" __global__ void l2_priority(const uint4* p, unsigned long long n, int last, unsigned* sink) {
    // last: load every 16 bytes with an L2::evict_last cache policy (as Triton's eviction_policy=
    // 'evict_last' does); else give each 128-byte line evict_normal priority again
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    unsigned acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        if (last) {
            unsigned x, y, z, w;
            asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                         : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "l"(p + i), "l"(policy));
            acc ^= x ^ y ^ z ^ w;
        } else if ((i & 7) == 0) {
            asm volatile("applypriority.global.L2::evict_normal [%0], 128;" :: "l"(p + i));
        }
    }
    if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads
}
"""
# the placement step's stand-in: each CTA's SM; the phase step's one-CTA launch
SMID_MAP_SRC = ('extern "C" __global__ void smid_map(unsigned* out) { if (threadIdx.x == 0) { unsigned s; '
                'asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); out[blockIdx.x] = s; } }')
# which SMs each line is near: one CTA an SM (its LDS leaves room for no second), each in turn
# (CTA b waits for *turn == b: no two measure at once), n dependent atomics (adding 0: the line
# keeps its value) and n dependent L2 loads of each line. An H100's L2 is two partitions; a
# line's atomics go to its home partition, while loads may be served by a copy in the near one
LINE_HOMES_SRC = r"""
extern "C" __global__ void line_homes(unsigned long long* const* lines, int nlines, int n,
                                      unsigned* turn, unsigned* out) {
    if (threadIdx.x != 0) return;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    while (*(volatile unsigned*)turn != blockIdx.x) __nanosleep(64);
    unsigned* row = out + blockIdx.x * (2 * nlines + 1);
    for (int l = 0; l < nlines; ++l) {
        unsigned long long* p = lines[l];
        unsigned long long v = atomicAdd(p, 0ull) & 0;  // the line in the L2 first
        long long t0 = clock64();
        for (int i = 0; i < n; ++i) v = atomicAdd(p + (v >> 63), 0ull);
        long long t1 = clock64();
        for (int i = 0; i < n; ++i) v = __ldcg(p + (v >> 63));
        row[1 + 2 * l] = unsigned((t1 - t0) / n);
        row[2 + 2 * l] = unsigned((clock64() - t1) / n) + (v == 0x9e3779b9ull);
    }
    row[0] = smid;  // (%smid may skip numbers: the SM's, not the CTA's)
    __threadfence();
    atomicAdd(turn, 1u);
}
"""
ONE_CTA_SRC = 'extern "C" __global__ void one_cta(unsigned* out) { if (threadIdx.x == 0) out[0] = 1; }'


STEPS = ("states", "chain", "timeline", "carveout", "pdl", "placement", "evict", "phase", "tunes", "rebuild", "address")


@functools.cache
def sm90_function(source: str, name: str):
    """A probe's own kernel ``name`` from ``source``, through the JIT's cache and module loader;
    once per process."""
    from codegen import jit
    from codegen.targets import get_target
    target = get_target("sm90")
    return jit.load_module(jit.compile_binary(source, f"{name}.cu", target), target).function(name)


@functools.cache
def sink() -> torch.Tensor:
    """One int the probe's own kernels may write, so that the compiler keeps their work."""
    return torch.zeros(1, dtype=torch.int32, device="cuda")


def cta_map(case) -> list[int]:
    """Where ours's CTAs land, CTA -> %smid: a stand-in of ours's grid, threads, LDS and carveout
    that writes each CTA's SM, launched right after one launch of ours"""
    k = case.kernel
    smid_fn = sm90_function(SMID_MAP_SRC, "smid_map")
    smid_fn.set_max_dynamic_shared(k.dynamic_lds)
    smid_fn.set_shared_carveout(k.ir.smem_carveout)
    out = torch.full((k.ir.blocks,), 0xFFFF, dtype=torch.int32, device="cuda")
    case._ours(0)
    smid_fn.launch(k.ir.blocks, k.ir.threads, k.dynamic_lds, torch.cuda.current_stream().cuda_stream,
                   [("u64", out.data_ptr())], cooperative=True)
    torch.cuda.synchronize()
    return out.tolist()


class LineHomes:
    """Which SMs each line is near (``LINE_HOMES_SRC``), by its atomics and by its loads: a line's
    SMs split at the midpoint of the fastest and the slowest; each distinct near set of a kind
    (atomics, loads) gets a letter in the order first seen (A, B, ...), so that lines and places
    can be compared by letters"""

    def __init__(self):
        self.sets: dict[str, list[frozenset[int]]] = {"atomics": [], "loads": []}

    @staticmethod
    def letter(k: int) -> str:
        """Near set k's name: A, B, ..., then its number"""
        return chr(ord('A') + k) if k < 26 else str(k)

    @staticmethod
    def near(cycles: dict[int, int]) -> frozenset[int]:
        """``cycles``: %smid -> cycles. The SMs at or below the midpoint of the fastest and the slowest"""
        cut = (min(cycles.values()) + max(cycles.values())) / 2
        return frozenset(sm for sm, c in cycles.items() if c <= cut)

    def label(self, kind: str, cycles: dict[int, int]) -> str:
        """``cycles``: %smid -> cycles. The near set's letter, the near / far median cycles, the count"""
        near = self.near(cycles)
        if near not in self.sets[kind]:
            self.sets[kind].append(near)
        k = self.sets[kind].index(near)
        mid = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0  # noqa: E731
        return (f"{self.letter(k)} ({mid([cycles[sm] for sm in near])} / "
                f"{mid([c for sm, c in cycles.items() if sm not in near])}, {len(near)} near)")

    def __call__(self, addresses: list[int], n: int = 32) -> list[str]:
        """For each address: 'atomics <label>, loads <label>'"""
        got = self.cycles(addresses, n)
        return [f"atomics {self.label('atomics', {row[0]: row[1 + 2 * i] for row in got})}, "
                f"loads {self.label('loads', {row[0]: row[2 + 2 * i] for row in got})}" for i in range(len(addresses))]

    def near_sets(self, addresses: list[int], n: int = 4) -> list[frozenset[int]]:
        """For each address the SMs its atomics are near: its home L2 partition's (DeepSeek session 47)"""
        got = self.cycles(addresses, n)
        return [self.near({row[0]: row[1 + 2 * i] for row in got}) for i in range(len(addresses))]

    @staticmethod
    def cycles(addresses: list[int], n: int) -> list[list[int]]:
        """``LINE_HOMES_SRC``'s rows, one an SM: its %smid, then each line's atomic and load cycles"""
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        fn = sm90_function(LINE_HOMES_SRC, "line_homes")
        lds = 200 << 10  # one CTA an SM
        fn.set_max_dynamic_shared(lds)
        fn.set_shared_carveout(100)
        lines = torch.tensor(addresses, dtype=torch.int64, device="cuda")
        turn = torch.zeros(1, dtype=torch.int32, device="cuda")
        out = torch.zeros(sms * (2 * len(addresses) + 1), dtype=torch.int32, device="cuda")
        fn.launch(sms, 32, lds, torch.cuda.current_stream().cuda_stream,
                  [("u64", lines.data_ptr()), ("i32", len(addresses)), ("i32", n), ("u64", turn.data_ptr()),
                   ("u64", out.data_ptr())], cooperative=True)
        torch.cuda.synchronize()
        return out.view(sms, 2 * len(addresses) + 1).cpu().tolist()


def l2_priority(address: int, nbytes: int, last: bool) -> None:
    """Load [address, address + nbytes) with an evict_last L2 policy (last) or demote its lines."""
    sm90_function(L2_PRIORITY_SRC, "l2_priority").launch(
        264, 512, 0, torch.cuda.current_stream().cuda_stream,
        [("u64", address), ("u64", nbytes // 16), ("i32", int(last)), ("u64", sink().data_ptr())])
    torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="6,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", default="states", choices=STEPS)
    ap.add_argument("--carveouts", default="-1,100,0", help="--steps carveout: percents to prefer (-1: none)")
    ap.add_argument("--places", type=int, default=16, help="--steps address: workspace places to try")
    ap.add_argument("--address-chains", type=int, default=0, help="--steps address: after the place passes, that many "
                    "times one run of the compiled chain, then the place passes again")
    ap.add_argument("--copies", type=int, default=0, help="weight copies the timings rotate through (0: the bench's, "
                    "enough to leave the L2 cold; 1: the weights stay in the L2)")
    ap.add_argument("--address-tunes", default="", help="--steps address: builds timed beside the spec's at each place "
                    "(';' between builds, ' ' between one build's knobs)")
    ap.add_argument("--mibs", default="8,16,32", help="--steps evict: MiB of evict_last lines to leave in the L2")
    ap.add_argument("--tunes", default="wq_b.l2_prefetch=0",
                    help="--steps tunes: builds beside the spec's, ';' between builds, ' ' between one build's knobs")
    a = ap.parse_args()
    tokens = [int(x) for x in a.tokens.split(",")]
    args = parse_args(["--kernels", "deepseek", "--no-jit", "--no-generate"])
    kb = DeepSeekBench(args, dry=False)
    copies = a.copies or auto_copies(device_meta(False)["l2_bytes"], kb.per_copy)
    timer = GpuTimer(replays=30)
    rows: dict[str, dict[int, list[float]]] = {}
    quiet = lambda *_: None  # noqa: E731

    def ours(label: str, case, s: int) -> float:
        us = timer.graph(case.contenders()["ours"]).median
        rows.setdefault(label, {}).setdefault(s, []).append(us)
        print(f"{time.time():.3f} {label:14s} S={s:<3d} {us:7.2f} us  (reserved {torch.cuda.memory_reserved() / 2**20:6.0f} MiB, "
              f"allocated {torch.cuda.memory_allocated() / 2**20:6.0f})", flush=True)
        return us

    def stamped_points(stamped, targs: dict, case) -> dict:
        """A timeline build's point stats on ``case``'s weight copies: its second round's stamps (the
        weights last read a round ago)"""
        launch = lambda i: stamped(**dict(targs, **case.w_ours[i % copies], layer=i % copies))  # noqa: E731
        warm_clocks(launch)
        got = []
        for i in range(2 * copies):
            launch(i)
            if i >= copies:
                got.append(targs["tl"].clone())
        torch.cuda.synchronize()
        return point_stats([t.cpu() for t in got], stamped.ir.timeline_points)

    def print_points(points: dict[str, dict]) -> None:
        """Each point's median (max) in every state of ``points``, side by side"""
        for name in next(iter(points.values())):
            print(f"  {name:14s} " + "  ->  ".join(f"{p_[1]:7.2f} ({p_[2]:6.2f})" for p_ in
                                                   (points[k].get(name, (0, 0, 0, 0)) for k in points)), flush=True)

    def make(s: int, compiled, bench=kb):
        case = bench.make_case(s, None, copies=copies, compiled=compiled, log=quiet)
        t0 = time.perf_counter()
        case.warm_up()
        if compiled is not None:
            print(f"(S={s}: warm-up with the compiled chain {time.perf_counter() - t0:.1f} s)", flush=True)
        return case

    def make_tuned(s: int, tune: str):
        """A plain case of the build ``tune`` names (' ' between its knobs)"""
        return make(s, None, DeepSeekBench(parse_args(["--kernels", "deepseek", *(f"--tune={t}" for t in tune.split())]), dry=False))

    def plain(label: str) -> None:
        for s in tokens:
            case = make(s, None)
            ours(label, case, s)
            case.release()

    for _ in range(a.rounds):
        plain("plain")
    compiled = torch.compile(kb.unfused, dynamic=False, backend="inductor")

    def chain_once(case) -> None:
        """One run of the compiled chain on ``case``'s inputs, finished."""
        case._unfused(compiled, 0)
        torch.cuda.synchronize()

    def slowed_case(s: int):
        """A plain case timed before and after one run of the compiled chain (the slow state's
        onset on a machine that shows it)."""
        case = make(s, None)
        ours("plain", case, s)
        chain_once(case)
        ours("plain+chain", case, s)
        return case

    for s in tokens if a.steps == "chain" else []:
        for _ in range(a.rounds):
            case = slowed_case(s)
            assert reset_persisting_l2(), "no cuCtxResetPersistingL2Cache here"
            ours("reset-l2", case, s)
            chain_once(case)
            case.w_chain = case.chain_in = case.swa_chain = None
            torch.cuda.empty_cache()
            ours("chain-dropped", case, s)
            case.release()
            case = make(s, None)
            for _ in range(10):
                case._unfused(case.unfused, 0)
            torch.cuda.synchronize()
            ours("plain+eager", case, s)
            case.release()
    for s in tokens if a.steps == "rebuild" else []:
        for _ in range(a.rounds):
            case = slowed_case(s)
            case.ws = case.kernel.workspace(case.device)
            case.base_args.update(case.ws)
            ours("new workspace", case, s)
            fresh = dc.launch_args(case.case, case.ws, device=str(case.device))
            case.base_args.update({k: v for k, v in fresh.items() if k not in WEIGHTS})
            ours("new in/outputs", case, s)
            case.w_ours = weight_copies({k: fresh[k] for k in WEIGHTS}, copies)
            ours("new weights", case, s)
            chain_once(case)
            ours("new+chain", case, s)
            case.release()
    for s in tokens if a.steps == "address" else []:
        case = make(s, None)
        builds = [("", case)] + [(f"{tune}: ", make_tuned(s, tune)) for tune in filter(None, a.address_tunes.split(";"))]
        gap = (1 << 20) + 4096  # places 1 MiB + 4 KiB apart: two to a 2 MiB page, each at its own offset in it
        pool = torch.zeros((a.places + 1) * gap, dtype=torch.uint8, device=case.device)
        passes: dict[str, list[float]] = {}  # (build, pass) -> times, for the summary
        counters: dict[str, list[int]] = {}  # (build, pass) -> the counter's address of each time

        def view(like: torch.Tensor, off: int) -> torch.Tensor:
            """A tensor shaped as ``like`` at byte ``off`` of the pool"""
            return pool[off:off + like.numel() * like.element_size()].view(like.dtype).view(like.shape)

        def placed(likes: dict, offs: dict[str, int]) -> dict:
            """Each workspace tensor (shaped as in ``likes``: a tune may change the sizes) at its pool
            offset, zeroed: a fresh workspace there (counter 0, no tags)"""
            ws = {k: view(likes[k], off) for k, off in offs.items()}
            for t in ws.values():
                t.zero_()
            return ws

        def at(name: str, what: str, i: int, offs: dict[str, int], build=case) -> float:
            """Ours (``build``) with its workspace placed at ``offs``"""
            ws = placed(build.ws, offs)
            build.ws = dict(build.ws, **ws)
            build.base_args.update(ws)
            us = ours(f"{name}{what} {i:2d} @{ws['scratch'].data_ptr() % (1 << 21):#08x}", build, s)
            passes.setdefault(f"{name}{what}", []).append(us)
            counters.setdefault(f"{name}{what}", []).append(ws["epoch"].data_ptr())
            return us

        counter = lambda i: i * gap + (1 << 20)  # noqa: E731  (place i's counter: 1 MiB past its scratch)
        both = lambda i: {"scratch": i * gap, "epoch": counter(i)}  # noqa: E731  (one page when i is even and the pool starts a page)
        by_place = dict.fromkeys(range(a.places), 0.0)
        for order in (range(a.places), reversed(range(a.places))):
            for i in order:
                for name, build in builds:
                    us = at(name, "place", i, both(i), build)
                    by_place[i] += us if build is case else 0.0
        fast, slow = min(by_place, key=by_place.get), max(by_place, key=by_place.get)
        homes = LineHomes()
        lines = ("xrdy", "qkvp", "qx8", "qrdy")  # the first line of each mailbox region
        print(f"S={s}: which SMs each place's lines are near (a letter a near set; near / far cycles)")
        sms = cta_map(case)
        print(f"S={s}: CTA -> SM {sms}")
        stage_sms = {}
        for stage in ("qkv", "kt"):  # where the few-CTA stages run
            ctas = [c for c, roles in enumerate(role_table(case.kernel.ir)) if any(r.stage == stage for r in roles)]
            stage_sms[stage] = {sms[c] for c in ctas}
            print(f"  {stage} CTAs {ctas} on SMs {[sms[c] for c in ctas]}")
        for i in sorted(by_place, key=by_place.get):
            got = homes([pool.data_ptr() + counter(i)]
                        + [pool.data_ptr() + i * gap + case.kernel.ir.region(r).offset for r in lines])
            print(f"  place {i:2d} ({by_place[i] / 2:6.2f} us): " + "; ".join(
                f"{what} {label}" for what, label in zip(("counter",) + lines, got)), flush=True)
        # The qkv CTAs poll the partials: whether a place's time follows the share of the partials'
        # lines at home in the qkv CTAs' partition (session 47: the first line's home read 0.14 us)
        part = case.kernel.ir.region("qkvp")
        step = 128 * max(1, -(-part.nbytes // 128 // 512))  # at most ~512 lines a place
        print(f"S={s}: the partials' lines (qkvp, {part.nbytes} B, every {step} B) at home where all the qkv CTAs' "
              "SMs are near")
        for i in sorted(by_place, key=by_place.get):
            base = pool.data_ptr() + i * gap + part.offset
            sets = homes.near_sets([base + o for o in range(0, part.nbytes, step)])
            print(f"  place {i:2d} ({by_place[i] / 2:6.2f} us): {sum(stage_sms['qkv'] <= h for h in sets)} of "
                  f"{len(sets)} lines near the qkv CTAs, {sum(not (stage_sms['qkv'] & h) for h in sets)} far from all",
                  flush=True)
        own = make(s, None) if a.address_chains else None  # a case with the allocator's own workspace, beside
        for r in range(a.address_chains):  # whether one run of the compiled chain moves the places' times
            ours(f"own before chain {r + 1}", own, s)
            chain_once(case)
            ours(f"own after chain {r + 1}", own, s)
            for order in (range(a.places), reversed(range(a.places))):
                for i in order:
                    at("", f"chain {r + 1}, place", i, both(i))
        if own is not None:
            own.release()
        spare = counter(a.places)  # a counter away from every place
        for name, build in builds:
            after = -(-build.ws["scratch"].numel() // 256) * 256  # the counter right after this build's scratch: one page
            for i in range(a.places):
                at(name, "scratch", i, {"scratch": i * gap, "epoch": spare}, build)
            for i in range(a.places):
                at(name, "epoch", i, {"scratch": fast * gap, "epoch": counter(i)}, build)
                if not name:  # which SMs the counter's line is near
                    print(f"  epoch {i:2d}: counter's line {homes([pool.data_ptr() + counter(i)])[0]}", flush=True)
            for order in (range(a.places), reversed(range(a.places))):
                for i in order:
                    at(name, "adjacent", i, {"scratch": i * gap, "epoch": i * gap + after}, build)
                    at(name, "apart", i, {"scratch": i * gap, "epoch": counter((i + a.places // 2) % a.places)}, build)
        stamped = codegen.load(KERNEL, timeline=True, tokens=s, tp=case.tp, ratio=case.ratio, tune=SPARE_POINTS)
        targs = dc.launch_args(case.case, stamped.workspace("cuda"))
        stamps = {}
        for label, i in (("fast", fast), ("slow", slow), ("fast again", fast)):
            targs.update(placed(targs, both(i)))
            stamps[label] = stamped_points(stamped, targs, case)
        for k, near in enumerate(homes.sets["atomics"]):
            print(f"  atomics' near set {homes.letter(k)}: SMs {sorted(near)}")
        print(f"S={s}: timeline medians at place {fast} (fast) and {slow} (slow) (us after the first CTA's start; max in brackets)")
        print_points(stamps)
        print(f"S={s}: min / mean / max over the places (us)")
        for what, us in passes.items():
            print(f"  {what:40s} {min(us):6.2f} / {sum(us) / len(us):6.2f} / {max(us):6.2f}  (n = {len(us)})")
        print(f"S={s}: the counter pass by bits of the counter's address (session 46: one H100 process's S = 6 "
              "was slow wherever bit 21 was set); min / mean / max (us)")
        for what, us in passes.items():
            if not what.endswith("epoch"):
                continue
            for bit in (20, 21, 22):
                for value in (0, 1):
                    got = [t for t, addr in zip(us, counters[what]) if (addr >> bit) & 1 == value]
                    if got:
                        print(f"  {what:20s} bit {bit} = {value}: {min(got):6.2f} / {sum(got) / len(got):6.2f} / "
                              f"{max(got):6.2f}  (n = {len(got)})")
        for _, build in builds:
            build.release()
    for s in tokens if a.steps == "carveout" else []:
        case = make(s, None)
        fn = case.kernel.compile()  # the loaded function: its preference is set here, then restored
        for percent in (int(x) for x in a.carveouts.split(",")):
            fn.set_shared_carveout(percent)
            for label, chain in (("eager", case.unfused), ("compiled", compiled)):
                case._unfused(chain, 0)
                torch.cuda.synchronize()
                ours(f"{percent:>3d} % {label}", case, s)
        fn.set_shared_carveout(case.kernel.ir.smem_carveout)
        case.release()

    def pdl_off_on(label: str, case, s: int) -> None:
        ours(label, case, s)
        case.kernel.pdl = False
        ours(f"{label} no-pdl", case, s)
        case.kernel.pdl = True
        ours(f"{label} pdl again", case, s)

    def placement(label: str, case, s: int) -> list[int]:
        """Ours timed, then the stand-in's CTA -> SM map after one more launch of ours."""
        k = case.kernel
        fn = k.compile()
        ours(label, case, s)
        m = cta_map(case)
        from cuda.bindings import driver
        err, limit = driver.cuCtxGetLimit(driver.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        print(f"   {label}: ours {fn.max_active_blocks_per_sm(k.ir.threads, k.dynamic_lds)} CTA(s)/SM, "
              f"{len(set(m))} SMs for {len(m)} CTAs, L2 persisting limit {limit} ({err}); CTA -> SM: {m[:16]} ..",
              flush=True)
        return m

    for s in tokens if a.steps == "evict" else []:
        case = make(s, None)
        ours("plain", case, s)
        for mib in (int(x) for x in a.mibs.split(",")):
            buf = torch.randint(0, 2**31, (mib << 18,), dtype=torch.int32, device="cuda")
            l2_priority(buf.data_ptr(), buf.numel() * 4, last=True)
            ours(f"+{mib} MiB evict_last", case, s)
            l2_priority(buf.data_ptr(), buf.numel() * 4, last=False)
            ours("  demoted", case, s)
            del buf
        case.release()
        case = make(s, compiled)
        ours("compiled", case, s)
        timer.graph(case.contenders()["compile"])
        ours("after compile", case, s)
        assert reset_persisting_l2(), "no cuCtxResetPersistingL2Cache here"
        ours("  reset-l2", case, s)
        segments = torch.cuda.memory_snapshot()
        for seg in segments:
            l2_priority(seg["address"], seg["total_size"], last=False)
        ours(f"  {len(segments)} segments demoted", case, s)
        case.release()
    for s in tokens if a.steps == "phase" else []:
        # the block scheduler's state: ours after each of 1..8 more one-CTA launches (session 39 saw
        # S = 6 slow after 1-8 one-CTA kernels, then put down to the split, pinned since)
        one = sm90_function(ONE_CTA_SRC, "one_cta")
        for r in range(a.rounds):
            case = make(s, None)
            ours(f"phase r{r} +0", case, s)
            for k in range(1, 9):
                one.launch(1, 32, 0, torch.cuda.current_stream().cuda_stream, [("u64", sink().data_ptr())])
                torch.cuda.synchronize()
                ours(f"phase r{r} +{k}", case, s)
            case.release()
    for s in tokens if a.steps == "tunes" else []:
        # each state timed on the spec's build and on each tuned one, all alive at once, so that
        # a build the state spares shows it (DeepSeek session 41: the slow state's partials reach
        # the qkv stage while every CTA's wq_b weights are prefetched into the L2)
        case = make(s, compiled)
        tuned = [(tune, make_tuned(s, tune)) for tune in a.tunes.split(";")]
        for r in range(a.rounds + 1):
            label = "warm-up" if r == 0 else f"timing {r}"
            if r:
                timer.graph(case.contenders()["compile"])
            ours(f"spec, {label}", case, s)
            for tune, other in tuned:
                ours(f"{tune}, {label}", other, s)
        for _, other in tuned:
            other.release()
        case.release()
    for s in tokens if a.steps == "placement" else []:
        case = make(s, compiled)
        fast = placement("compiled (warm-up)", case, s)
        for _ in range(2):
            timer.graph(case.contenders()["compile"])
            slow = placement("after compiled timing", case, s)
            print(f"   CTAs on another SM than after the warm-up: {sum(x != y for x, y in zip(fast, slow))}", flush=True)
            fn = case.kernel.compile()
            for percent in (int(x) for x in a.carveouts.split(",")):
                fn.set_shared_carveout(percent)
                ours(f"{percent:>3d} % after", case, s)
            fn.set_shared_carveout(case.kernel.ir.smem_carveout)
        case.release()
    for s in tokens if a.steps == "pdl" else []:
        case = make(s, compiled)
        pdl_off_on("compiled", case, s)
        timer.graph(case.contenders()["compile"])
        pdl_off_on("after compile", case, s)
        time.sleep(3)
        ours("after compile, 3 s idle", case, s)
        timer.graph(case.contenders()["compile"])
        time.sleep(3)
        ours("after compile again, 3 s idle", case, s)
        case.release()
        case = make(s, None)
        pdl_off_on("plain", case, s)
        timer.graph(case.contenders()["eager"])
        pdl_off_on("after eager", case, s)
        case.release()
    # the timeline step's cases: a plain one, then a compiled one, each stamped before and after
    # what may bring the slow state on
    timeline_cases = ((None, (("plain", None), ("plain+chain", chain_once))),
                      (compiled, (("compiled", None), ("after timing", lambda c: timer.graph(c.contenders()["compile"])))))
    for s in tokens if a.steps == "timeline" else []:
        for _ in range(a.rounds):
            points = {}
            for chain, steps in timeline_cases:
                case = make(s, chain)
                stamped = codegen.load(KERNEL, timeline=True, tokens=s, tp=case.tp, ratio=case.ratio, tune=SPARE_POINTS)
                targs = dc.launch_args(case.case, stamped.workspace("cuda"))
                for label, before in steps:
                    if before is not None:
                        before(case)
                    ours(label, case, s)
                    points[label] = stamped_points(stamped, targs, case)
                case.release()
            print(f"S={s}: timeline medians (us after the first CTA's start; max in brackets): " + " -> ".join(points))
            print_points(points)
    for s in tokens if a.steps == "states" else []:
        case = make(s, compiled)
        ours("compiled", case, s)
        print(f"{'(chain)':14s} S={s:<3d} {timer.graph(case.contenders()['compile']).median:7.2f} us", flush=True)
        ours("after", case, s)
        if s == tokens[0]:
            try:
                from torch._inductor.async_compile import shutdown_compile_workers
                shutdown_compile_workers()
                print("(inductor's compile workers shut down)", flush=True)
            except Exception as e:  # noqa: BLE001 - the probe goes on without this step
                print(f"(no shutdown_compile_workers: {e})", flush=True)
        ours("no-workers", case, s)
        torch.cuda.empty_cache()
        ours("emptied", case, s)
        beside = make(s, None)
        ours("plain-beside", beside, s)
        beside.release()
        case.release()
        again = make(s, compiled)
        ours("compiled-again", again, s)
        again.release()
    for _ in range(a.rounds):
        plain("plain-again")
    print("\n| state | " + " | ".join(f"S = {s}" for s in tokens) + " |\n|---|" + "---:|" * len(tokens))
    for label, by_s in rows.items():
        print(f"| {label} | " + " | ".join(" / ".join(f"{u:.2f}" for u in by_s.get(s, [])) for s in tokens) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
