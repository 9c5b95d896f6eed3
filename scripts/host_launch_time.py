"""Host time of one eager launch, checked (``kernel(**args)``) against bound (``kernel.bind``),
for both specs, on the GPU machine: the CPU cost a decode step pays per launch outside a CUDA
graph. Each row: median over rounds of (wall time of N launches enqueued back to back) / N:
checked with the same arguments each call (its prepared launch reused, as in a decode loop),
checked with the prepared launches dropped before each call ("fresh": new arguments each call),
bound; then the bound launch's parts, each timed alone the same way: its address checks, torch's
current stream the public way (``current_stream().cuda_stream``, what launches took until
session 57) and the launch's own way (``launch._current_stream_handle``: torch's raw-stream
getter), and the prepared
driver call; then the GPU time of one launch from a CUDA graph of N,
for scale (bench.timing.GpuTimer, the bench's method, but the same weights each launch: warm in
L2, unlike the bench's rotated copies). N is kept small (100 by default) so that the driver's
launch queue does not fill and make the host wait for the GPU.

``--stub`` needs no GPU: our Python's share alone, on CPU tensors (placed at their addresses,
so without the device checks), the launch's stream a stand-in and every driver call a no-op
(the CUDA backend's, its launch config built as on a GPU); the other columns are "-".

    PYTHONPATH=. python scripts/host_launch_time.py [--launches 100] [--rounds 7] [--stub]
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
from codegen import launch  # noqa: E402
from bench.timing import GpuTimer  # noqa: E402
from tests import deepseek_case as dc  # noqa: E402
from tests.minimax_case import launch_args, make_inputs  # noqa: E402


def minimax(tokens: int, target: str | None, device: str):
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, target=target)
    inputs = make_inputs(tokens, kernel.target.name, seed=7)
    return kernel, launch_args(inputs, kernel.workspace(device), device=device)


def deepseek(tokens: int, target: str | None, device: str):
    kernel = codegen.load("deepseek_v41/attn_front", tokens=tokens, tp=4, ratio=1, target=target)
    case = dc.make_case(tokens, 4, 1, kernel.target.name, seed=7)
    return kernel, dc.launch_args(case, kernel.workspace(device), device=device)


def place_at_address(self, a, value, packed, current_device):
    """``Kernel._place`` for CPU tensors: each at its address, without the device checks."""
    return ("u64", value.data_ptr()) if a.is_tensor and value is not None else packed


def stub_gpu(function=None, set_attr=setattr) -> None:
    """Launches without a GPU (``--stub``, and the CPU tests' launches): CPU tensors placed at
    their addresses, the launch's stream 0 on cuda:0 (the process's kernel device), every
    kernel compiled to ``function`` (default: a CudaFunction whose driver calls are no-ops).
    ``set_attr`` replaces each (pytest's ``monkeypatch.setattr`` undoes them after a test)."""
    import codegen.jit
    from codegen.jit import cuda as jcuda

    if function is None:
        function = jcuda.CudaFunction(None, "stub", "handle")
        set_attr(jcuda, "ensure_context", lambda: None)
        set_attr(jcuda, "_driver_call", lambda name, *args: None)

    def compile_stub(self):  # the device claim as compile() makes it, then the stand-in function
        self._device = launch._claim_device(self)
        return function

    set_attr(launch.Kernel, "_place", place_at_address)
    set_attr(launch.Kernel, "compile", compile_stub)
    set_attr(codegen.jit, "process_device", lambda target, backend=None: 0)
    set_attr(torch.cuda, "current_device", lambda: 0)
    set_attr(launch, "_current_stream_handle", lambda device: 0)
    set_attr(torch.cuda, "synchronize", lambda: None)


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
    ap.add_argument("--stub", action="store_true", help="no GPU: our Python's share alone (CPU tensors, no-op driver)")
    args = ap.parse_args(argv)
    if args.stub:
        stub_gpu()
    target, device = ("sm90", "cpu") if args.stub else (None, "cuda")
    where = "stub driver, CPU tensors" if args.stub else torch.cuda.get_device_name()
    print(f"{where}: host us a launch (median of {args.rounds} rounds of {args.launches}), GPU us a launch (graph)")
    cols = ("checked", "fresh", "bound", "checks", "stream", "raw", "driver", "GPU")
    print(f"{'kernel':<24} {'S':>3} " + " ".join(f"{c:>8}" for c in cols))

    def us(call) -> float:
        return host_us(call, args.launches, args.rounds)

    specs = (("minimax_m3/pre_attn", minimax, (1, 16)), ("deepseek_v41/attn_front", deepseek, (1, 16)))
    for name, make, tokens in specs:
        for s in tokens:
            kernel, kargs = make(s, target, device)
            kernel(**kargs)  # compile and load outside the timings
            bound = kernel.bind(**kargs)
            row = {"checked": us(lambda: kernel(**kargs)),
                   "fresh": us(lambda: (kernel._prepared_launches.clear(), kernel(**kargs))),
                   "bound": us(bound),
                   # the bound call's parts (BoundLaunch.__call__ and Kernel._launch, taken apart here)
                   "checks": us(lambda: [t.data_ptr() != a for _, t, a in bound._addresses])}
            if not args.stub:
                index = torch.cuda.current_device()
                raw = torch.cuda.current_stream().cuda_stream
                row.update(stream=us(lambda: torch.cuda.current_stream().cuda_stream),
                           raw=us(lambda: launch._current_stream_handle(index)),
                           driver=us(lambda: bound._prepared(raw)),
                           GPU=GpuTimer(replays=10).graph([bound] * args.launches).median)
            print(f"{name:<24} {s:>3} " + " ".join(f"{row[c]:>8.1f}" if c in row else f"{'-':>8}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
