"""Time the DeepSeek-V4.1 attn_front kernel on the GPU (sm90), warm (the
weights in L2) and cold (L2 flushed before each launch),
next to the streaming floor (weight bytes / measured copy bandwidth). Warm: 20
launches back to back in a CUDA graph; cold: each launch after a 256 MiB write
(same graph), the writes' own time subtracted.

    PYTHONPATH=. python3 scripts/bench_deepseek_front.py [out.txt]"""

from __future__ import annotations

import statistics
import sys

import torch

import codegen
from tests import deepseek_case as dc

SPEC = "deepseek_v41/attn_front"
BUILDS = [(1, 4), (16, 4), (48, 4), (1, 2), (16, 2), (48, 2)]


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(5):
        dst.copy_(src)
    e1.record()
    torch.cuda.synchronize()
    return 2 * 5 * src.numel() / (e0.elapsed_time(e1) * 1e-3)  # bytes read + written per second


REPS = 20


def graph_us(step) -> float:
    """Microseconds of one replay of a CUDA graph of REPS calls of ``step``
    (the median of 5 replays, after one warm-up)."""
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(REPS):
            step()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def main() -> None:
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
    flags = [dict(tokens=s, tp=tp, ratio=1, tuned=tuned) for s, tp in BUILDS for tuned in (False, True)]
    dc.precompile(flags)
    bw = copy_bandwidth()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"{torch.cuda.get_device_name()}  copy bandwidth {bw / 1e12:.2f} TB/s", file=out)
    print(f"{'build':28s} {'warm us':>8s} {'cold us':>8s} {'floor us':>8s}  (weight MB)", file=out)
    for f in flags:
        k = codegen.load(SPEC, **f)
        case = dc.make_case(f["tokens"], f["tp"], 1, "sm90", seed=1)
        args = dc.launch_args(case, k.workspace("cuda"))
        k(**args)
        torch.cuda.synchronize()
        warm = graph_us(lambda: k(**args)) / REPS
        # cold: L2 flushed by a 256 MiB write before each launch (both in one graph),
        # the flushes alone timed the same way and subtracted
        cold = (graph_us(lambda: (flush.zero_(), k(**args))) - graph_us(flush.zero_)) / REPS
        wbytes = sum(args[n].numel() for n in ("wqkv", "wqkv_s", "wqb", "wqb_s"))
        label = f"S={f['tokens']} tp={f['tp']}" + (" tuned" if f["tuned"] else "")
        print(f"{label:28s} {warm:8.1f} {cold:8.1f} {wbytes / bw * 1e6:8.1f}  ({wbytes / 1e6:.1f})",
              file=out, flush=True)


if __name__ == "__main__":
    main()
