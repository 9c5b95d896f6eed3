"""Host time of one eager launch, checked (``kernel(**args)``) against bound (``kernel.bind``),
for both specs, on the GPU machine: the CPU cost a decode step pays per launch outside a CUDA
graph. Each row: median over rounds of (wall time of N launches enqueued back to back) / N;
then the bound launch's parts, each timed alone the same way: its address checks, torch's
current stream (``current_stream().cuda_stream``), the same through torch's private raw-stream
getter, and the prepared driver call; then the GPU time of one launch from a CUDA graph of N,
for scale (bench.timing.GpuTimer, the bench's method, but the same weights each launch: warm in
L2, unlike the bench's rotated copies). N is kept small (100 by default) so that the driver's
launch queue does not fill and make the host wait for the GPU.

    PYTHONPATH=. python scripts/host_launch_time.py [--launches 100] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import codegen  # noqa: E402
from bench.timing import GpuTimer  # noqa: E402
from tests import deepseek_case as dc  # noqa: E402
from tests.minimax_case import launch_args, make_inputs  # noqa: E402


def minimax(tokens: int):
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens)
    return kernel, launch_args(make_inputs(tokens, kernel.target.name, seed=7), kernel.workspace("cuda"))


def deepseek(tokens: int):
    kernel = codegen.load("deepseek_v41/attn_front", tokens=tokens, tp=4, ratio=1)
    case = dc.make_case(tokens, 4, 1, kernel.target.name, seed=7)
    return kernel, dc.launch_args(case, kernel.workspace("cuda"))


def host_us(call, launches: int, rounds: int) -> float:
    """Median host microseconds a call, each round's launches enqueued back to back."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            call()
        times.append((time.perf_counter() - start) / launches * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}: host us a launch (median of {args.rounds} rounds of "
          f"{args.launches}), GPU us a launch (graph)")
    print(f"{'kernel':<22} {'S':>3} {'checked':>8} {'bound':>8} {'checks':>8} {'stream':>8} {'raw':>8} {'driver':>8} {'GPU':>8}")
    for name, make, tokens in (("minimax_m3/pre_attn", minimax, (1, 16)), ("deepseek_v41/attn_front", deepseek, (1, 16))):
        for s in tokens:
            kernel, kargs = make(s)
            kernel(**kargs)  # compile and load outside the timings
            bound = kernel.bind(**kargs)
            checked = host_us(lambda: kernel(**kargs), args.launches, args.rounds)
            fast = host_us(bound, args.launches, args.rounds)
            # the bound call's parts (BoundLaunch.__call__ and Kernel._launch, taken apart here)
            checks = host_us(lambda: [t.data_ptr() != a for _, t, a in bound._addresses], args.launches, args.rounds)
            stream = host_us(lambda: torch.cuda.current_stream().cuda_stream, args.launches, args.rounds)
            device = torch.cuda.current_device()
            rawget = host_us(lambda: torch._C._cuda_getCurrentRawStream(device), args.launches, args.rounds)
            raw = torch.cuda.current_stream().cuda_stream
            driver = host_us(lambda: bound._prepared(raw), args.launches, args.rounds)
            gpu = GpuTimer(replays=10).graph([bound] * args.launches).median
            print(f"{name:<22} {s:>3} {checked:>8.1f} {fast:>8.1f} {checks:>8.1f} {stream:>8.1f} {rawget:>8.1f} {driver:>8.1f} {gpu:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
