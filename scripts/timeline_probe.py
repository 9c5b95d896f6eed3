"""Per-stage time of one MiniMax pre_attn launch from its timeline stamps
(GPU): for each point, the min / median / max over CTAs of (stamp - earliest
start), in microseconds, each the median over the last round's launches; and the
per-call time of the same build without stamps, replayed from a CUDA graph
(bench.timing). Weights cold as in the bench: the launches rotate over enough
copies of w_qkv to overflow the L2, the stamps are those of the last round over
them (--slowest: the last launch's).

Usage: python scripts/timeline_probe.py [--cold-keys] [--no-mma] [--no-key-loads] [--heads-twice]
    [--warm-weights] [--slowest=POINT] [--ctas=A,B,..] [--by-cta=POINT] [tokens ...] [flag=value ...]
(flags: build parameters, e.g. timeline-free ones like static_kv_scale=true, or
spec knobs as stage.field=value, e.g. qkv.bulk_copies=1: codegen.load's tune).
The index cache is 16 MB with pages drawn with replacement (its keys stay in the L2);
--cold-keys gives every request its own pages, as the bench does (64K: 134 MB at S=16);
--no-mma times the build without its fp8 MMAs (scripts/no_mma.py: wrong results, what they cost);
--no-key-loads times it with a scorer that reads no keys (scripts/no_key_loads.py: wrong scores,
what the keys' arrival costs beyond the tiles' compute);
--heads-twice runs each head task twice (scripts/heads_twice.py: the stamps are the second, warm pass's);
--warm-weights launches on one copy of the weights, so that nothing streams them (or the code) out of L2
(its graph replays are one launch a graph: their per-call time is not the bench's);
--slowest=POINT also lists the 8 CTAs that stamped POINT last, each with all its stamps (a
straggler's roles show in its other stamps);
--ctas=A,B,.. lists those CTAs with all their stamps (e.g. the CTA of a head task and the CTAs
that compute its rows);
--by-cta=POINT gives each CTA's POINT as the median over the launches (every CTA's, in order), the 8
fastest and slowest CTAs by it, and how alike two halves of the launches rank the CTAs (the
correlation of their per-CTA medians: near 1, a CTA is late by its place, e.g. its SM or its share
of the stream-K split; near 0, by chance)."""

import sys

import torch

import codegen
from codegen.__main__ import name_values
from codegen.trace import point_stats
from bench.run import auto_copies
from bench.timing import GpuTimer, warm_clocks
from scripts.heads_twice import heads_twice
from scripts.no_key_loads import without_key_loads
from scripts.no_mma import without_fp8_mma
from tests.minimax_case import NUM_BLOCKS, context_case, launch_args, make_inputs


SWITCHES = ("--cold-keys", "--no-mma", "--no-key-loads", "--heads-twice", "--warm-weights")
COLD_KEYS, NO_MMA, NO_KEY_LOADS, HEADS_TWICE, WARM_WEIGHTS = (s in sys.argv for s in SWITCHES)
TWINS = ("--no-mma", "--no-key-loads", "--heads-twice")  # the switches that build a probe twin
SLOWEST = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--slowest=")), None)
CTAS = [int(c) for a in sys.argv[1:] if a.startswith("--ctas=") for c in a.split("=", 1)[1].split(",")]
BY_CTA = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--by-cta=")), None)


def build(tokens: int, tune: dict | None, **flags):
    """The kernel as launched here: codegen.load's, or (--no-mma, --no-key-loads, --heads-twice) its probe twin."""
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, tune=tune, **flags)
    kernel = without_fp8_mma(kernel) if NO_MMA else kernel
    kernel = heads_twice(kernel) if HEADS_TWICE else kernel
    return without_key_loads(kernel) if NO_KEY_LOADS else kernel


def setup(kernel, tokens: int, contexts) -> tuple[dict, list]:
    inp = make_inputs(tokens, kernel.target.name, seed=1)
    if COLD_KEYS:
        blocks = NUM_BLOCKS + tokens * -(-max(contexts) // 128)
        case = context_case(tokens, 1, list(contexts), seed=2, num_blocks=blocks, distinct=True)
        args = launch_args(inp, kernel.workspace("cuda"), num_blocks=blocks)
    else:
        case = context_case(tokens, 1, list(contexts), seed=2)
        args = launch_args(inp, kernel.workspace("cuda"))
    args.update(seq_lens=case["seq_lens"].cuda(), block_table=case["block_table"].cuda(), bt_width=case["bt_cols"],
                index_cache=case["index_cache_bytes"].cuda().view(inp["fp8"]))
    copies = auto_copies(torch.cuda.get_device_properties(0).L2_cache_size, args["w_qkv"].numel())  # the bench's rule
    copies = 1 if WARM_WEIGHTS else copies  # one copy: the weights (and the kernel's code) stay in L2
    return args, [args["w_qkv"].clone() for _ in range(copies)]


def probe(tokens: int, contexts=(4096,), reps: int = 20, tune: dict | None = None, **flags) -> None:
    kernel = build(tokens, tune, timeline=True, **flags)
    for opt, point in (("--slowest", SLOWEST), ("--by-cta", BY_CTA)):
        if point is not None and point not in kernel.ir.timeline_points:
            sys.exit(f"{opt}={point}: not a timeline point; give one of {', '.join(kernel.ir.timeline_points)}")
    args, weights = setup(kernel, tokens, contexts)

    def launch(i: int) -> None:
        args["w_qkv"] = weights[i % len(weights)]
        kernel(**args)

    warm_clocks(launch)  # 25 ms of launches first: the clocks up, as in the bench
    runs = max(reps, 2 * len(weights))
    samples = []  # the last round's stamps: each launch's weights cold (last read a round ago)
    for i in range(runs):
        launch(i)
        if i >= runs - len(weights):
            samples.append(args["tl"].clone())  # stream order: after this launch
    torch.cuda.synchronize()
    samples = [t.cpu() for t in samples]  # int64 ns, subtracted as integers (codegen.trace.point_stats)
    tl = samples[-1]
    pts = kernel.ir.timeline_points
    t0 = tl[:, 0][tl[:, 0] > 0].min()
    twins = "".join(f" {s[2:].replace('-', ' ').upper()}" for s in TWINS if s in sys.argv)  # e.g. " NO MMA"
    print(f"S={tokens} contexts={list(contexts)} {flags or ''} {tune or ''}{twins}, "
          f"{'warm' if WARM_WEIGHTS else 'cold'} weights ({len(weights)} copies): "
          f"us from the first CTA's start, min / median / max over CTAs that stamp, each the median of {len(samples)} launches")
    for p, (lo, med, hi, n) in point_stats(samples, pts).items():
        print(f"  {p:14s} n={n:4d}  min {lo:7.2f}  median {med:7.2f}  max {hi:7.2f}")
    us = (tl - t0).double() / 1000.0 * (tl > 0)  # 0: not stamped
    listed = us[:, pts.index(SLOWEST)].argsort(descending=True)[:8].tolist() if SLOWEST is not None else []
    for c in listed + CTAS:
        print(f"  CTA {c:3d}: " + " ".join(f"{n} {us[c, i]:.2f}" for i, n in enumerate(pts) if tl[c, i] > 0))
    if BY_CTA is not None:
        by_cta(samples, pts.index(BY_CTA))
    # timed as the bench times them: this stamped build (its per-call time less the stamped span is
    # what the launch costs outside its CTAs), and its twin without stamps
    plain = build(tokens, tune, **flags)
    for what, kern in (("stamped", kernel), ("no stamps", plain)):
        kargs, weights = setup(kern, tokens, contexts)
        calls = [lambda i=i, kern=kern, kargs=kargs, ws=weights: kern(**dict(kargs, w_qkv=ws[i], layer=i))
                 for i in range(len(weights))]
        sample = GpuTimer(replays=30).graph(calls)
        print(f"  graph replay ({what}): {sorted(sample.us)[len(sample.us) // 2]:7.2f} us per call")


def by_cta(samples: list, p: int) -> None:
    """--by-cta: point p of each CTA that stamps it in every launch, the median over the launches
    (us after each launch's first start); the fastest and slowest, and the two halves' correlation."""
    stamps = torch.stack(samples)  # [launches, CTAs, points], int64 ns
    starts = torch.where(stamps[:, :, 0] > 0, stamps[:, :, 0], stamps[:, :, 0].max())
    us = (stamps[:, :, p] - starts.min(1, keepdim=True).values).double() / 1000.0  # [launches, CTAs]
    ctas = (stamps[:, :, p] > 0).all(0).nonzero().flatten()
    if len(ctas) == 0:
        print("  by CTA: no CTA stamps this point in every launch (a spare point needs a STAGE.*_point=spare tune)")
        return
    med = us[:, ctas].median(0).values
    order = med.argsort()
    half = len(samples) // 2
    a, b = us[:half, ctas].median(0).values, us[half:, ctas].median(0).values
    corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if half else float("nan")
    print(f"  by CTA ({len(ctas)} CTAs, median over {len(samples)} launches): min {med.min():.2f} median "
          f"{med.median():.2f} max {med.max():.2f}; halves' correlation {corr:.2f}")
    for name, part in (("fastest", order[:8]), ("slowest", order.flip(0)[:8])):
        print(f"    {name}: " + ", ".join(f"{int(ctas[i])} {float(med[i]):.2f}" for i in part))
    # a pattern's shape; scripts/bycta_join.py joins these lines of several runs CTA by CTA
    print("    every CTA, in order: " + " ".join(f"{int(c)}:{float(m):.2f}" for c, m in zip(ctas, med)))


if __name__ == "__main__":
    words = [a for a in sys.argv[1:] if a not in SWITCHES and not a.startswith(("--slowest=", "--ctas=", "--by-cta="))]
    tokens = [int(a) for a in words if "=" not in a] or [1, 16]
    pairs = name_values([a for a in words if "=" in a])
    flags = {k: v for k, v in pairs.items() if "." not in k}
    tune = {k: v for k, v in pairs.items() if "." in k} or None
    for s in tokens:
        probe(s, tune=tune, **flags)
        probe(s, contexts=(65536,), tune=tune, **flags)
