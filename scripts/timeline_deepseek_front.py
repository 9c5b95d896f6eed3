"""Where a DeepSeek-V4.1 attn_front launch spends its time (sm90): a timeline
build's per-CTA stamps (ns: the SM's cycles placed between the CTA's %globaltimer reads), as microseconds after the first
CTA's start: min / median / max over the CTAs that reached each point.

    PYTHONPATH=. python3 scripts/timeline_deepseek_front.py [out.txt] [--cold | --rotate] [--no-mma] [--slowest=POINT] [--tokens=16,48] [stage.field=value ...]

(stage.field=value: spec knob overrides, codegen.load's tune, e.g. wq_b.bulk_weights=0;
--tokens: only the builds of these row counts (a probe point some build refuses), TP4 where
BUILDS has none;
--slowest=POINT also lists the 8 CTAs that stamped POINT last, each with all its stamps:
a straggler's role shows in its other stamps; --cold: the timed launch follows an L2 flush, so the
weights come from HBM, and so does the kernel's code; --rotate: as the bench, the launches cycle
through 8 copies of the weights (`layer` = copy), after 25 ms of them (bench.timing.warm_clocks:
the clocks up, as in the bench), so the stamped launches' weights are cold and their code is not:
the phases the code's first fetch from HBM slows in a --cold timeline read as in the bench;
each figure is then the median over the second round's 8 launches; --no-mma: the build without its
fp8 MMAs, scripts/no_mma.py: wrong results, the time they cost). With --rotate it also times the
stamped build and its twin without stamps from a CUDA graph over the copies, as the bench does: the
stamped per-call time less the stamped span (first start .. last stamp) is what the launch costs
outside its CTAs; the twin's time shows whether the stamps move it)"""

from __future__ import annotations

import sys

import torch

import codegen
from bench.deepseek import WEIGHTS  # the tensors the bench copies
from bench.timing import GpuTimer, Watchdog, warm_clocks
from codegen.__main__ import name_values
from codegen.trace import point_stats
from scripts.no_mma import without_fp8_mma
from tests import deepseek_case as dc

SPEC = "deepseek_v41/attn_front"
COPIES = 8  # --rotate: 8 x 19.7 MB of weights, over twice the H200's 60 MiB L2 (the bench's count)
BUILDS = [dict(tokens=1, tp=4), dict(tokens=16, tp=4), dict(tokens=48, tp=4), dict(tokens=48, tp=2)]


def main() -> None:
    slowest = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--slowest=")), None)
    cold = "--cold" in sys.argv[1:]
    rotate = COPIES if "--rotate" in sys.argv[1:] else 0
    no_mma = "--no-mma" in sys.argv[1:]
    only = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--tokens=")), None)
    builds = BUILDS if only is None else [b for b in BUILDS if str(b["tokens"]) in only.split(",")] + [
        dict(tokens=int(n), tp=4) for n in only.split(",") if all(str(b["tokens"]) != n for b in BUILDS)]
    words = [a for a in sys.argv[1:] if not a.startswith(("--slowest=", "--tokens=")) and a not in ("--cold", "--rotate", "--no-mma")]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda") if cold else None  # > 4x the H200's 60 MiB L2
    files = [a for a in words if "=" not in a]
    tune = name_values([a for a in words if "=" in a]) or None
    out = open(files[0], "w") if files else sys.stdout
    if tune is None and not no_mma:
        dc.precompile([dict(b, timeline=True) for b in builds])
    for b in builds:
        k = codegen.load(SPEC, timeline=True, tune=tune, **b)
        if slowest is not None and slowest not in k.ir.timeline_points:
            sys.exit(f"--slowest={slowest}: not a timeline point of {SPEC}; give one of {', '.join(k.ir.timeline_points)}")
        k = without_fp8_mma(k) if no_mma else k
        case = dc.make_case(b["tokens"], b["tp"], 1, "sm90", seed=2)
        args = dc.launch_args(case, k.workspace("cuda"))
        samples = []  # the stamps of the launches reported
        with Watchdog(120).step(f"the timeline launches of S={b['tokens']} tp={b['tp']} {tune or ''}"):
            if rotate:  # two rounds over the copies: the second round's weights were last read a round ago
                copies = [{w: args[w] for w in WEIGHTS}] + [{w: args[w].clone() for w in WEIGHTS} for _ in range(rotate - 1)]
                warm_clocks(lambda i: k(**dict(args, **copies[i % rotate], layer=i % rotate)))  # as the bench's warm-up
                for i in range(2 * rotate):
                    k(**dict(args, **copies[i % rotate], layer=i % rotate))
                    if i >= rotate:
                        samples.append(args["tl"].clone())  # stream order: after this launch
            else:
                for i in range(5):  # warm: the last of five launches; cold: the L2 flushed before it
                    if flush is not None and i == 4:
                        flush.fill_(i)
                    k(**args)
                samples.append(args["tl"])
            torch.cuda.synchronize()
        samples = [t.cpu() for t in samples]  # int64 ns: see point_stats
        tl = samples[-1]
        t0 = tl[:, 0].min()
        each = f", each the median of {len(samples)} launches" if len(samples) > 1 else ""
        print(f"S={b['tokens']} tp={b['tp']} {'cold ' if cold else 'rotated ' if rotate else ''}{'NO MMA ' if no_mma else ''}{tune or ''}: us after the first CTA's start (min / median / max over CTAs{each})", file=out)
        for name, (lo, med, hi, n) in point_stats(samples, k.ir.timeline_points).items():
            print(f"  {name:12s} {lo:7.2f} {med:7.2f} {hi:7.2f}  ({n} CTAs)", file=out)
        if slowest is not None:  # the last launch's
            pts = k.ir.timeline_points
            us = (tl - t0).double() / 1e3 * (tl > 0)  # 0: not stamped
            for c in us[:, pts.index(slowest)].argsort(descending=True)[:8].tolist():
                print(f"  CTA {c:3d}: " + " ".join(f"{n} {us[c, i]:.2f}" for i, n in enumerate(pts) if tl[c, i] > 0), file=out)
        if rotate:  # timed as the bench times them: this stamped build, and its twin without stamps
            plain = codegen.load(SPEC, tune=tune, **b)
            plain = without_fp8_mma(plain) if no_mma else plain
            for what, kern in (("stamped", k), ("no stamps", plain)):
                kargs = dc.launch_args(case, kern.workspace("cuda"))
                calls = [lambda i=i, kern=kern, kargs=kargs: kern(**dict(kargs, **copies[i], layer=i)) for i in range(rotate)]
                sample = GpuTimer(replays=30).graph(calls)
                print(f"  graph replay ({what}): {sorted(sample.us)[len(sample.us) // 2]:7.2f} us per call", file=out)
    out.flush()


if __name__ == "__main__":
    main()
