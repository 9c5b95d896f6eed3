"""``make bench`` = ``python -m bench.run``: MiniMax-M3 pre_attn at S = 1, 4, 16.

For each S: the correctness guard (every contender once, compared; abort if
they disagree), then each contender timed from one CUDA graph over cold weight
copies (bench/timing.py), next to the streaming floor (bench/minimax.py bytes
/ the copy bandwidth measured in this run). Also: JIT cold compile (fresh
cache folder), warm cache load, module load, and ``make generate`` wall time.

Writes: the table (stdout), bench/pre_attn.png (if matplotlib is there),
an entry appended to bench/RESULTS.md, and, when $OUT (or --out) is set,
$OUT/bench.json, $OUT/pre_attn.png and $OUT/RESULTS-entry.md.

``--dry-run``: everything but the timing, on the CPU (no GPU needed): the
kernel is built and its arguments checked, a stand-in writes the reference's
values into its mailbox, the unfused chain runs eagerly and through
``torch.compile`` (eager backend), the guard compares them, the JIT and
generate timings are real, the times are fake; outputs go to --out or a temp
folder, never to bench/."""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import report
from bench.minimax import HIDDEN, KERNEL, QKV_ROWS, GuardError, PreAttnCase
from bench.timing import FakeTimer, GpuTimer

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TOKENS = (1, 4, 16)
CONTEXTS = ()  # hook: context lengths for context-dependent stages (indexer scores, attention);
# none: the GPU tests' default launch (seq_lens 100: no block is scored)
L2_FALLBACK = 60 << 20


def log(*a) -> None:
    print(*a, flush=True)


def git_commit() -> str:
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
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


def jit_timings(tokens: int, target: str, gpu: bool) -> dict:
    """Render (spec -> HIP), cold compile into a fresh MONO_CACHE_DIR, warm
    cache load (same folder), and on a GPU the module load; seconds."""
    from codegen import jit, render

    out = {}
    t0 = time.perf_counter()
    ir, src = render.source(KERNEL, target, tokens=tokens)
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
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts S (default 1,4,16)")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)),
                    help="context lengths for context-dependent stages (default none: seq_lens 100)")
    ap.add_argument("--replays", type=int, default=50, help="timed graph replays per contender (median)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed graph replays first")
    ap.add_argument("--copies", type=int, default=0, help="weight copies per graph (0: > 2x L2, at least 8)")
    ap.add_argument("--gemm", default="auto", choices=("auto", "scaled_mm", "dequant"),
                    help="GEMM of the unfused chain (auto: torch._scaled_mm where the GPU has FP8)")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; dry run eager)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile contender")
    ap.add_argument("--no-jit", action="store_true", help="skip the JIT cold/warm timings")
    ap.add_argument("--no-generate", action="store_true", help="skip the make generate timing")
    ap.add_argument("--no-guard", action="store_true", help="time even if the contenders disagree (reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for bench.json etc. (default $OUT)")
    ap.add_argument("--results", default=None, help="markdown file to append to (default bench/RESULTS.md)")
    ap.add_argument("--plot", default=None, help="PNG to write (default bench/pre_attn.png)")
    ap.add_argument("--no-plot", action="store_true", help="write no plot")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        log("error: no GPU visible to torch; run on the GPU machine, or use --dry-run to check the harness here")
        return 2
    tokens = [int(x) for x in args.tokens.split(",") if x]
    contexts = [int(x) for x in args.contexts.split(",") if x] or [None]
    out_dir = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="bench-dry-")) if dry else None)
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    results_path = Path(args.results) if args.results else (out_dir / "RESULTS.md" if dry else BENCH / "RESULTS.md")
    plot_path = Path(args.plot) if args.plot else (out_dir / "pre_attn.png" if dry else BENCH / "pre_attn.png")

    dev = device_meta(dry)
    per_copy = QKV_ROWS * HIDDEN + QKV_ROWS * 4
    copies = args.copies or (2 if dry else auto_copies(dev["l2_bytes"], per_copy))
    timer = FakeTimer(args.replays) if dry else GpuTimer(args.replays, args.warmup)
    from codegen.reference.minimax_m3_unfused import pick_gemm, pre_attn_unfused

    gemm = pick_gemm("cpu" if dry else "cuda") if args.gemm == "auto" else args.gemm
    meta = {
        "kernel": KERNEL, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(), "torch": torch.__version__, "python": sys.version.split()[0],
        "dry_run": dry, "copies": copies, "replays": timer.replays, "warmup": args.warmup, "gemm": gemm,
        "target": "sm90" if dry else None, "notes": [], **dev,
    }
    if gemm == "dequant" and not dry:
        meta["notes"].append("the unfused GEMM is a dequantized f32 matmul (no torch._scaled_mm here): "
                             "not production-like")
    log(f"bench: {KERNEL} on {dev['gpu']}, torch {torch.__version__}, commit {meta['commit']}, "
        f"{copies} weight copies ({copies * per_copy / 2**20:.0f} MiB, L2 {dev['l2_bytes'] / 2**20:.0f} MiB)"
        + (" [DRY RUN: times are fake]" if dry else ""))

    extras: dict = {}
    compiled = None
    if not args.no_compile:
        backend = args.compile_backend or ("eager" if dry else "inductor")
        compiled = torch.compile(pre_attn_unfused, dynamic=False, backend=backend)
        meta["compile_backend"] = backend

    extras["copy_bandwidth"] = timer.copy_bandwidth()
    bw = extras["copy_bandwidth"]["bytes_per_s"]
    log(f"copy bandwidth: {bw / 1e12:.3f} TB/s (read + written){' [fake]' if dry else ''}")

    rows, cases_json = [], []
    for s in tokens:
        for ctx in contexts:
            case = PreAttnCase(s, ctx, copies=copies, gemm=gemm, compiled=compiled, seed=args.seed, dry_run=dry,
                               log=log)
            meta["target"] = case.target.name
            nbytes = case.bytes()
            floor_us = nbytes["total"] / bw * 1e6
            entry = {"tokens": s, "context": ctx, "bytes": nbytes, "floor_us": floor_us}
            entry["warm_up"] = case.warm_up()
            compiled = case.compiled if compiled is not None else None  # a failed compile is dropped
            try:
                entry["guard"] = case.guard()
                log(f"S={s}: guard ok ({', '.join(entry['guard'])})")
            except GuardError as e:
                if not args.no_guard:
                    log(f"\n*** GUARD FAILED ***\n{e}\n")
                    entry["guard_error"] = str(e)
                    if out_dir:  # what was measured so far, and the failing case's statistics
                        report.write_json(out_dir / "bench.json", {"meta": meta, "cases": cases_json + [entry],
                                                                   **extras})
                    return 1
                entry["guard_error"] = str(e)
                meta["notes"].append(f"S={s}: GUARD FAILED (timed anyway, --no-guard)")
                log(f"WARNING (--no-guard): {e}")
            fake = {"ours": 1.6 * floor_us + 2, "eager": 6 * floor_us + 30, "compile": 2.5 * floor_us + 8}
            for name, calls in case.contenders().items():
                try:
                    sample = timer.graph(calls, fake_us=fake[name])
                except Exception as e:  # noqa: BLE001 - reported; the other contenders still run
                    msg = f"S={s}: timing {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    meta["notes"].append(msg)
                    entry[f"{name}_us"] = None
                    log("ERROR: " + msg)
                    continue
                entry[f"{name}_us"] = sample.median
                entry[f"{name}_timing"] = sample.summary()
                log(f"S={s}: {name:8s} {sample.median:8.2f} us (median of {len(sample.us)}; "
                    f"min {min(sample.us):.2f})")
            for note in case.notes:
                if note not in meta["notes"]:
                    meta["notes"].append(note)
            case.release()
            rows.append(entry)
            cases_json.append(entry)

    if not args.no_jit:
        try:
            extras["jit"] = jit_timings(1, meta["target"], gpu=not dry)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            extras["jit"] = {"error": f"{type(e).__name__}: {e}"}
        log("JIT (S=1): " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in extras["jit"].items()))
    if not args.no_generate:
        extras["generate"] = generate_timing()
        g = extras["generate"]
        log("make generate: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in g.items() if not k.endswith("stderr")))

    log("")
    log(report.format_table(rows))
    for n in meta["notes"]:
        log(f"note: {n}")
    entry_md = report.markdown_entry(meta, rows, extras)
    report.append_results(results_path, entry_md)
    log(f"\nappended to {results_path}")
    why = "no plot (--no-plot)" if args.no_plot else report.plot(rows, plot_path,
                                                                f"{KERNEL} on {dev['gpu']} ({meta['commit']})")
    log(why or f"plot: {plot_path}")
    data = {"meta": meta, "cases": cases_json, **extras}
    if out_dir:
        report.write_json(out_dir / "bench.json", data)
        (out_dir / "RESULTS-entry.md").write_text(entry_md)
        if not why and plot_path.resolve() != (out_dir / plot_path.name).resolve():
            shutil.copy(plot_path, out_dir / plot_path.name)
        log(f"json: {out_dir / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
