"""``make bench`` = ``python -m bench.run``: MiniMax-M3 pre_attn (K1) at S = 1, 4,
16 and contexts 4K and 64K (``--contexts``), and DeepSeek-V4.1 attn_front (TP4,
16 local heads) at S = 1, 6, 16, 48.

For each kernel and S (and context): the correctness guard (every contender
once, checked; the kernel's timing is skipped if they disagree), then each contender timed
from one CUDA graph over cold weight copies (bench/timing.py), next to the
streaming floor (the case's bytes / the copy bandwidth measured in this run;
bench/minimax.py, bench/deepseek.py). Also: JIT cold compile (fresh cache
folder), warm cache load and module load of each kernel, and ``make
generate`` wall time. ``--kernels minimax,deepseek`` picks (default both).
``--places N`` (default 5) times ours with its workspace at N places and takes the median
place (where DeepSeek's workspace lies can move it by ~1 us; bench/NOTES.md).

Writes: the tables (stdout), one plot per kernel (bench/pre_attn.png,
bench/attn_front.png; if matplotlib is there), one entry per kernel appended
to bench/RESULTS.md, and, when $OUT (or --out) is set, $OUT/bench.json (after
every case), the PNGs and $OUT/RESULTS-entry.md.

``--dry-run``: everything but the timing, on the CPU (no GPU needed): each
kernel is built and its arguments checked, a stand-in writes the reference's
values where the kernel writes them, the unfused chains run eagerly and
through ``torch.compile`` (eager backend), the guards compare them, the JIT
and generate timings are real, the times are fake; outputs go to --out or a
temp folder, never to bench/."""

from __future__ import annotations

import argparse
import datetime
import importlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from bench import report
from bench.case import GuardError
from bench.timing import FakeTimer, GpuTimer, Sample, Watchdog
from codegen.__main__ import name_values

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
# --places: a workspace every 1 MiB + 4 KiB, so that the places walk 2 MiB pages and the offsets in them
PLACE_GAP = (1 << 20) + 4096
# Ours's time is the median over this many places by default: where DeepSeek's workspace lies moved
# S = 6 by 0.5-1.4 us on one H100 (bench/NOTES.md, DeepSeek sessions 45-47), so one place is one draw
PLACES = 5  # odd: the median is a place's own
CONTEXTS = (4096, 65536)  # minimax: tokens every row sees (the 4K and 64K); --contexts ""
# runs the GPU tests' default launch instead (seq_lens 100: no block is scored)
L2_FALLBACK = 60 << 20


class MinimaxBench:
    """MiniMax-M3 pre_attn (bench/minimax.py)."""

    key = "minimax"
    png = "pre_attn.png"
    takes_contexts = True
    floor_note = ("floor: bytes read + written (weights, scales, activations, the scored blocks' index keys, "
                  "the outputs) / copy bandwidth")

    def __init__(self, args, dry: bool):
        from bench import minimax
        from codegen.reference.minimax_m3_unfused import k1_unfused, pick_gemm

        self._mod = minimax
        self.kernel = minimax.KERNEL
        self.default_tokens = (1, 4, 16)
        self.build = ""
        self.flags: dict = {}
        self.per_copy = minimax.QKV_ROWS * minimax.HIDDEN + minimax.QKV_ROWS * 4
        self.gemm = pick_gemm("cpu" if dry else "cuda") if args.gemm == "auto" else args.gemm
        self.unfused = k1_unfused
        self.args, self.dry = args, dry

    def make_case(self, s: int, ctx, *, copies: int, compiled, log):
        return self._mod.PreAttnCase(s, ctx, copies=copies, gemm=self.gemm, compiled=compiled, seed=self.args.seed,
                                     dry_run=self.dry, tune=self.args.tune, pdl=not self.args.no_pdl,
                                     cooperative=not self.args.no_cooperative, log=log)

    def gemm_note(self) -> str | None:
        if self.gemm == "dequant" and not self.dry:
            return "the unfused GEMM is a dequantized f32 matmul (no torch._scaled_mm here): not production-like"
        return None


class DeepSeekBench:
    """DeepSeek-V4.1 attn_front at TP --tp (bench/deepseek.py)."""

    key = "deepseek"
    png = "attn_front.png"
    takes_contexts = False
    floor_note = ("floor: bytes read (fp8 weights + E8M0 codes + activations) / copy bandwidth; the writes "
                  "(q, records, key table) are not in it")

    def __init__(self, args, dry: bool):
        from bench import deepseek
        from codegen.reference.deepseek_v41_unfused import attn_front_unfused

        self._mod = deepseek
        self.kernel = deepseek.KERNEL
        self.default_tokens = deepseek.TOKENS
        self.tp = args.tp
        self.build = f"TP{args.tp}, {64 // args.tp} local heads, ratio {deepseek.RATIO}"
        self.flags = {"tp": args.tp, "ratio": deepseek.RATIO}
        self.per_copy = deepseek.per_copy_bytes(args.tp)
        self.gemm = "dequant-bf16"
        self.unfused = attn_front_unfused
        self.args, self.dry = args, dry

    def make_case(self, s: int, ctx, *, copies: int, compiled, log):
        return self._mod.AttnFrontCase(s, None, copies=copies, compiled=compiled, seed=self.args.seed,
                                       dry_run=self.dry, tp=self.tp, tune=self.args.tune, pdl=not self.args.no_pdl,
                                       cooperative=not self.args.no_cooperative, log=log)

    def gemm_note(self) -> str | None:
        return ("the unfused GEMMs dequantize their MXFP8 operands to bf16 on every call and run a bf16 matmul "
                "(f32 accumulation): torch has no MXFP8 GEMM on sm90")


BENCHES = {"minimax": MinimaxBench, "deepseek": DeepSeekBench}


def log(*a) -> None:
    print(*a, flush=True)


def git_commit() -> str:
    """BENCH_COMMIT if set (the lent machine's own git checkout may be an older one than the
    tree it runs), else this checkout's HEAD, marked "+modified" when tracked files differ
    from it (the tree benched is then not that commit)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=30)
            return out.stdout.strip() + ("+modified" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def device_meta(dry_run: bool) -> dict:
    if dry_run or not torch.cuda.is_available():
        return {"gpu": "none (dry run, CPU)", "l2_bytes": L2_FALLBACK, "sms": None, "cuda": torch.version.cuda}
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"gpu": p.name, "l2_bytes": int(getattr(p, "L2_cache_size", 0) or L2_FALLBACK),
            "sms": p.multi_processor_count, "cuda": torch.version.cuda or torch.version.hip,
            "capability": f"{p.major}.{p.minor}"}


def auto_copies(l2_bytes: int, per_copy: int) -> int:
    """Weight copies per graph: their bytes exceed 2x the L2 (at least 8)."""
    return max(8, math.ceil(2 * l2_bytes / per_copy) + 1)


# ----------------------------------------------------------------------------- JIT and generate timings


def jit_timings(kernel: str, tokens: int, target: str, gpu: bool, tune: dict | None = None, **flags) -> dict:
    """Render (spec -> HIP), cold compile into a fresh MONO_CACHE_DIR, warm
    cache load (same folder), and on a GPU the module load; seconds."""
    from codegen import jit, render

    out = {}
    t0 = time.perf_counter()
    ir, src = render.source(kernel, target, tokens=tokens, tune=tune, **flags)
    out["render_s"] = time.perf_counter() - t0
    name = f"{ir.kernel.replace('/', '_')}.{ir.target.name}.hip"
    backend = jit.backend_for(ir.target)
    jit._backend_module(backend).compiler_version()  # load the compiler library outside the timing
    old = os.environ.get("MONO_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="mono-bench-cache-") as tmp:
        os.environ["MONO_CACHE_DIR"] = tmp
        try:
            t0 = time.perf_counter()
            binary, hit = jit.compile_binary_cached(src, name, ir.target)
            out["cold_compile_s"] = time.perf_counter() - t0
            if hit:
                out["note"] = "cold compile found a cache entry (unexpected)"
            t0 = time.perf_counter()
            _, hit = jit.compile_binary_cached(src, name, ir.target)
            out["warm_cache_s"] = time.perf_counter() - t0
            if not hit:
                out["note"] = "warm load missed the cache"
        finally:
            if old is None:
                os.environ.pop("MONO_CACHE_DIR", None)
            else:
                os.environ["MONO_CACHE_DIR"] = old
    out["binary_bytes"] = len(binary)
    if gpu and backend == "cuda":
        from codegen.jit.cuda import CudaModule

        t0 = time.perf_counter()
        mod = CudaModule(binary)
        mod.function(ir.name)
        out["module_load_s"] = time.perf_counter() - t0
    out["tokens"] = tokens
    return out


GENERATE_TREE = ("codegen", "specs", "templates", "generated", "docs")


def generate_timing() -> dict:
    """Wall time of ``make generate``'s commands: ``python -m codegen
    generate`` (and ``python -m codegen docs`` where the CLI has it), run in
    a temporary copy of the tree so that the working tree is never written."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        for name in GENERATE_TREE:
            if (ROOT / name).exists():
                shutil.copytree(ROOT / name, Path(tmp) / name, ignore=shutil.ignore_patterns("__pycache__"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        for cmd in ("generate", "docs"):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "codegen", cmd], cwd=tmp, env=env, capture_output=True,
                               text=True)
            secs = time.perf_counter() - t0
            if cmd == "docs" and p.returncode == 2 and "invalid choice" in p.stderr:
                break  # no docs command in this version
            out[f"{cmd}_s"] = secs
            out[f"{cmd}_exit"] = p.returncode
            if p.returncode:
                out[f"{cmd}_stderr"] = p.stderr[-2000:]
    out["wall_s"] = sum(v for k, v in out.items() if k.endswith("_s"))
    return out


# ----------------------------------------------------------------------------- the run


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU only: everything but the timing (fake numbers)")
    ap.add_argument("--kernels", default=",".join(BENCHES),
                    help=f"which kernels, in order (default {','.join(BENCHES)})")
    ap.add_argument("--tokens", default=None,
                    help="token counts S for every kernel (default: minimax 1,4,16; deepseek 1,6,16,48)")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)),
                    help=f"minimax: tokens every row sees (default {','.join(map(str, CONTEXTS))}; "
                         "'' = the GPU tests' seq_lens 100, nothing scored)")
    ap.add_argument("--tp", type=int, default=4, choices=(2, 4), help="deepseek: tensor-parallel ranks (default 4)")
    ap.add_argument("--replays", type=int, default=50, help="timed graph replays per contender (median)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed graph replays first")
    ap.add_argument("--copies", type=int, default=0, help="weight copies per graph (0: > 2x L2, at least 8)")
    ap.add_argument("--places", type=int, default=PLACES, metavar="N",
                    help="time ours with its workspace at N places (the allocator's own, then N - 1 places "
                         f"{PLACE_GAP // 1024} KiB apart in one pool); its time is the median of the places' "
                         f"medians, each place's in the entry (default {PLACES}; 1: the allocator's own only)")
    ap.add_argument("--gemm", default="auto", choices=("auto", "scaled_mm", "dequant"),
                    help="minimax: GEMM of the unfused chain (auto: torch._scaled_mm where the GPU has FP8)")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; dry run eager)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile contender")
    ap.add_argument("--no-pdl", action="store_true",
                    help="launch ours without programmatic dependent launch (each launch after the previous one's end)")
    ap.add_argument("--no-cooperative", action="store_true",
                    help="launch ours without the cooperative attribute (its grid's co-residency then rests on nothing "
                         "else running; with PDL the next launch's CTAs may wait on SMs beside it)")
    ap.add_argument("--no-jit", action="store_true", help="skip the JIT cold/warm timings")
    ap.add_argument("--no-generate", action="store_true", help="skip the make generate timing")
    ap.add_argument("--no-guard", action="store_true", help="time even if the contenders disagree (reported)")
    ap.add_argument("--tune", action="append", default=[], metavar="STAGE.FIELD=VALUE",
                    help="override a spec knob of our builds (repeatable; codegen.load's tune, checked like the "
                         "spec's values): name the kernel it belongs to in --kernels. The run's meta, table "
                         "entry and plot title name it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for bench.json etc. (default $OUT)")
    ap.add_argument("--results", default=None, help="markdown file to append to (default bench/RESULTS.md)")
    ap.add_argument("--plot-dir", default=None,
                    help="folder for the PNGs (default bench/; dry run: the output folder)")
    ap.add_argument("--no-plot", action="store_true", help="write no plot")
    ap.add_argument("--watchdog", type=float, default=300.0, metavar="SECONDS",
                    help="stop (status 3, the partial results saved) when one case runs longer: a kernel that "
                         "never ends (default 300; 0: no limit)")
    args = ap.parse_args(argv)
    if args.places < 1:
        ap.error(f"--places: {args.places}; give 1 (the allocator's own workspace) or more")
    args.tune = name_values(args.tune) or None
    if args.tune and any("." not in k for k in args.tune):
        ap.error(f"--tune: {', '.join(k for k in args.tune if '.' not in k)}: name a stage's knob as STAGE.FIELD (or a symbol as symbols.NAME)")
    args.kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [k for k in args.kernels if k not in BENCHES]
    if bad or not args.kernels:
        ap.error(f"--kernels: unknown {bad or 'none given'}; choose from {', '.join(BENCHES)}")
    return args


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"


def run_kernel(kb, args, run: dict, *, timer, bw: float, dev: dict, common: dict, save, watchdog: Watchdog) -> bool:
    """Every S (and context) of one kernel: guard, then each contender timed,
    into ``run["meta"]`` / ``run["cases"]`` as it goes (``save()`` writes what
    is known after each case). Returns whether every case passed its guard
    and ran without error. A failing guard stops this kernel's timing (unless
    --no-guard); an error in one case is recorded and the next S runs."""
    dry = common["dry_run"]
    copies = args.copies or (2 if dry else auto_copies(dev["l2_bytes"], kb.per_copy))
    meta = run["meta"] = dict(common, kernel=kb.kernel, build=kb.build, copies=copies, gemm=kb.gemm,
                              target="sm90" if dry else None, floor_note=kb.floor_note, notes=[])
    def build_also(label: str) -> None:  # a variant of the spec's build: named wherever the run is reported
        meta["build"] = ", ".join(x for x in (meta["build"], label) if x)

    if args.tune:
        meta["tune"] = ", ".join(f"{k}={v}" for k, v in args.tune.items())
        build_also(f"tune {meta['tune']}")
    rows = run["cases"]
    note = kb.gemm_note()
    if note:
        meta["notes"].append(note)
    if args.places > 1:
        meta["notes"].append(f"ours is the median over {args.places} places of its workspace (the allocator's own, "
                             f"then places {PLACE_GAP // 1024} KiB apart in one pool), each place's median in the "
                             "entry's ours_places_us: where DeepSeek's workspace lies moved S = 6 by ~1 us on an "
                             "H100 (bench/NOTES.md, DeepSeek session 45)")
    if args.no_cooperative:
        build_also("not cooperative")
    if args.no_pdl:
        build_also("no PDL")
    else:
        meta["notes"].append("ours launches with programmatic dependent launch (sm90): each launch lets the next "
                             "begin as soon as all its CTAs have started, and waits for the previous one's end before "
                             "any memory access, so the graph's launches of ours overlap their neighbours' ramp-up "
                             "and drain; --no-pdl times them one after the other")

    def add_notes(notes):
        for n in notes:
            if n not in meta["notes"]:
                meta["notes"].append(n)

    def time_ours_again(case, entry, lbl, fake_us):
        """Ours once more, after the other contenders ran: a with-compile run once timed
        DeepSeek S = 16 1.1 us slower than a run without (bench/NOTES.md, DeepSeek session 17;
        session 39: the SM's L1 / shared split the previous kernels left, which a build that sets
        grid.smem_carveout no longer inherits), so the table's time (ours first) is checked
        against a second one in the same state: the allocator's own workspace place, as the
        first place of --places was. A difference over 3 % becomes a note of the entry."""
        contenders = case.contenders()
        if entry.get("ours_us") is None or len(contenders) < 2:
            return
        first = entry.get("ours_places_us", [entry["ours_us"]])[0]
        sample = timer.graph(contenders["ours"], fake_us=fake_us)
        entry["ours_again_us"] = sample.median
        log(f"{lbl}: ours again {sample.median:6.2f} us (after the others; first {first:.2f})")
        if abs(sample.median - first) > 0.03 * first:
            meta["notes"].append(f"{lbl}: ours timed again after the other contenders: {sample.median:.2f} us "
                                 f"(timed first at the same workspace place: {first:.2f})")

    def time_over_places(case, calls, entry, lbl, fake_us) -> Sample:
        """Ours with its workspace at each of --places places: DeepSeek's time at some S follows
        where the workspace lies, ~1 us apart at S = 6 on one H100 (bench/NOTES.md, DeepSeek
        session 45), so one allocation is one draw. Returns the sample of the place whose median is
        the median (the lower middle one for an even count); the entry's ``ours_places_us`` holds
        every place's, the allocator's own first."""
        pool = torch.empty(args.places * PLACE_GAP + case.workspace_bytes(), dtype=torch.uint8, device=case.device)
        samples = []
        try:
            for k in range(args.places):
                addr = case.place_workspace(None if k == 0 else pool, (k - 1) * PLACE_GAP)
                samples.append(timer.graph(calls, fake_us=fake_us + 0.01 * k))
                log(f"{lbl}: ours at place {k} (scratch at 2 MiB page offset {addr % (1 << 21):#08x}): "
                    f"{samples[-1].median:6.2f} us")
        finally:
            case.place_workspace(None)
        entry["ours_places_us"] = [x.median for x in samples]
        ranked = sorted(samples, key=lambda x: x.median)
        median = ranked[(len(ranked) - 1) // 2]
        meta["notes"].append(f"{lbl}: ours over {len(ranked)} workspace places {ranked[0].median:.2f} / "
                             f"{median.median:.2f} / {ranked[-1].median:.2f} us (min / median / max; the "
                             f"allocator's own {samples[0].median:.2f})")
        return median

    log(f"\nbench: {kb.kernel}{f' ({kb.build})' if kb.build else ''} on {dev['gpu']}, {copies} weight copies "
        f"({copies * kb.per_copy / 2**20:.0f} MiB, L2 {dev['l2_bytes'] / 2**20:.0f} MiB)"
        + (" [DRY RUN: times are fake]" if dry else ""))
    compiled = None
    if not args.no_compile:
        backend = args.compile_backend or ("eager" if dry else "inductor")
        compiled = torch.compile(kb.unfused, dynamic=False, backend=backend)
        meta["compile_backend"] = backend
    tokens = [int(x) for x in args.tokens.split(",") if x] if args.tokens else list(kb.default_tokens)
    contexts = ([int(x) for x in args.contexts.split(",") if x] if kb.takes_contexts else []) or [None]
    ok = True
    carveouts: dict[str, int] = {}  # case -> ours' grid.smem_carveout (-1: the driver's)
    for ctx in contexts:  # one context's rows together (the table's and the plot's grouping)
        for s in tokens:
            lbl = f"S={s}" if ctx is None else f"S={s} ctx={ctx}"
            entry = {"kernel": kb.kernel, "tokens": s, "context": ctx}
            rows.append(entry)
            case = None
            try:
                with watchdog.step(f"{kb.kernel} {lbl}"):
                    case = kb.make_case(s, ctx, copies=copies, compiled=compiled, log=log)
                    meta["target"] = case.target.name
                    carveouts[lbl] = case.kernel.ir.smem_carveout
                    nbytes = case.bytes()
                    floor_us = nbytes.get("floor", nbytes["total"]) / bw * 1e6
                    entry.update(bytes=nbytes, floor_us=floor_us)
                    entry["warm_up"] = case.warm_up()
                    compiled = case.compiled if compiled is not None else None  # a failed compile is dropped
                    try:
                        entry["guard"] = case.guard()
                        log(f"{lbl}: guard ok ({', '.join(entry['guard'])})")
                    except GuardError as e:
                        entry["guard_error"] = str(e)
                        ok = False
                        if not args.no_guard:
                            log(f"\n*** GUARD FAILED ***\n{e}\n")
                            meta["notes"].append(f"{lbl}: GUARD FAILED: {kb.kernel} not timed from here on")
                            add_notes(case.notes)
                            return False
                        meta["notes"].append(f"{lbl}: GUARD FAILED (timed anyway, --no-guard)")
                        log(f"WARNING (--no-guard): {e}")
                    fake = {"ours": 1.6 * floor_us + 2, "eager": 6 * floor_us + 30, "compile": 2.5 * floor_us + 8}
                    for name, calls in case.contenders().items():
                        try:
                            if name == "ours" and args.places > 1:
                                sample = time_over_places(case, calls, entry, lbl, fake[name])
                            else:
                                sample = timer.graph(calls, fake_us=fake[name])
                        except Exception as e:  # noqa: BLE001 - reported; the other contenders still run
                            msg = f"{lbl}: timing {name} failed: {_short(e)}"
                            meta["notes"].append(msg)
                            entry[f"{name}_us"] = None
                            log("ERROR: " + msg)
                            continue
                        entry[f"{name}_us"] = sample.median
                        entry[f"{name}_timing"] = sample.summary()
                        log(f"{lbl}: {name:8s} {sample.median:8.2f} us (median of {len(sample.us)}; "
                            f"min {min(sample.us):.2f})")
                    time_ours_again(case, entry, lbl, fake["ours"])
                    add_notes(case.notes)
            except Exception as e:  # noqa: BLE001 - recorded; the next S still runs
                ok = False
                entry["error"] = traceback.format_exc()[-4000:]
                entry.setdefault("floor_us", None)
                meta["notes"].append(f"{lbl}: ERROR {_short(e)}")
                log(f"ERROR in {kb.kernel} {lbl}:\n{entry['error']}")
            finally:
                if case is not None:
                    case.release()
                save()
    if any(c >= 0 for c in carveouts.values()):  # the SM's L1 / shared split is part of the result
        meta["notes"].append("ours prefers this share of the SM's L1 / shared memory as shared memory (grid.smem_carveout; "
                             "-1: the driver's, which keeps the split the previous kernel left): "
                             + ", ".join(f"{lbl} {c} %" if c >= 0 else f"{lbl} -1" for lbl, c in carveouts.items()))
        save()
    return ok


def main(argv=None) -> int:
    args = parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        log("error: no GPU visible to torch; run on the GPU machine, or use --dry-run to check the harness here")
        return 2
    out_dir = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="bench-dry-")) if dry else None)
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    results_path = Path(args.results) if args.results else (out_dir / "RESULTS.md" if dry else BENCH / "RESULTS.md")
    plot_dir = Path(args.plot_dir) if args.plot_dir else (out_dir if dry else BENCH)
    if not args.no_compile:  # one compiled graph per S and kernel: never fall back to eager silently
        cfg = importlib.import_module("torch._dynamo").config
        limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, limit, max(getattr(cfg, limit), 64))

    dev = device_meta(dry)
    timer = FakeTimer(args.replays) if dry else GpuTimer(args.replays, args.warmup)
    common = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(), "torch": torch.__version__, "python": sys.version.split()[0],
        "dry_run": dry, "replays": timer.replays, "warmup": args.warmup, **dev,
    }
    log(f"bench: {', '.join(args.kernels)} on {dev['gpu']}, torch {torch.__version__}, commit {common['commit']}"
        + (" [DRY RUN: times are fake]" if dry else ""))
    extras: dict = {"copy_bandwidth": timer.copy_bandwidth()}
    bw = extras["copy_bandwidth"]["bytes_per_s"]
    log(f"copy bandwidth: {bw / 1e12:.3f} TB/s (read + written){' [fake]' if dry else ''}")

    runs: dict[str, dict] = {}  # kernel -> {"meta", "cases", "jit"}
    meta = dict(common, kernels=[], notes=[])

    def data() -> dict:
        cases = [c for r in runs.values() for c in r["cases"]]
        return {"meta": meta, "cases": cases, "kernels": runs, **extras}

    def save() -> None:
        if out_dir:
            report.write_json(out_dir / "bench.json", data())

    def stopped(msg: str) -> None:  # the watchdog's last act: what was measured, and why it ends
        meta["notes"].append(msg)
        save()

    watchdog = Watchdog(args.watchdog, on_fire=stopped)
    status = 0
    for key in args.kernels:
        kb = BENCHES[key](args, dry)
        meta["kernels"].append(kb.kernel)
        run = runs[kb.kernel] = {"meta": {"kernel": kb.kernel, "notes": []}, "cases": [], "png": kb.png}
        try:
            run["ok"] = run_kernel(kb, args, run, timer=timer, bw=bw, dev=dev, common=common, save=save,
                                   watchdog=watchdog)
        except Exception as e:  # noqa: BLE001 - the other kernels still run; reported
            run["ok"] = False
            run["meta"]["notes"].append(f"ERROR: {_short(e)}")
            run["error"] = traceback.format_exc()[-4000:]
            log(f"ERROR in {kb.kernel}:\n{run['error']}")
        if not run["ok"]:
            status = 1
        save()
        if not args.no_jit and run["meta"].get("target"):
            try:
                run["jit"] = jit_timings(kb.kernel, 1, run["meta"]["target"], gpu=not dry, tune=args.tune, **kb.flags)
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                run["jit"] = {"error": _short(e)}
            log(f"JIT {kb.kernel} (S=1): " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                       for k, v in run["jit"].items()))
        save()
    if not args.no_generate:
        extras["generate"] = generate_timing()
        g = extras["generate"]
        log("make generate: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in g.items() if not k.endswith("stderr")))

    entries = []
    for i, (kernel, run) in enumerate(runs.items()):
        kmeta, rows = run["meta"], run["cases"]
        log(f"\n{kernel}" + (f" ({kmeta['build']})" if kmeta.get("build") else ""))
        if not rows or "copies" not in kmeta:
            log(f"{kernel}: no results ({'; '.join(kmeta['notes'])})")
            continue
        kextras = {"copy_bandwidth": extras["copy_bandwidth"]}
        if "jit" in run:
            kextras["jit"] = run["jit"]
        if i == 0 and "generate" in extras:
            kextras["generate"] = extras["generate"]
        log(report.format_table(rows))
        for n in kmeta["notes"]:
            log(f"note: {n}")
        verdict = report.targets_note(kmeta, rows, kextras)
        if verdict:
            log(verdict)
        entry_md = report.markdown_entry(kmeta, rows, kextras)
        entries.append(entry_md)
        timed = any(r.get(f"{n}_us") is not None for r in rows for n in ("ours", "eager", "compile"))
        if not timed:
            log(f"{kernel}: nothing timed: no entry appended to {results_path}, no plot")
            continue
        report.append_results(results_path, entry_md)
        log(f"appended to {results_path}")
        png = plot_dir / run["png"]
        why = "no plot (--no-plot)" if args.no_plot else report.plot(rows, png, report.plot_title(kmeta))
        log(why or f"plot: {png}")
        if out_dir and not why and png.resolve() != (out_dir / png.name).resolve():
            shutil.copy(png, out_dir / png.name)
    save()
    if out_dir:
        (out_dir / "RESULTS-entry.md").write_text("\n".join(entries))
        log(f"json: {out_dir / 'bench.json'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
