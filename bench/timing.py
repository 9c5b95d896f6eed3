"""Timing: CUDA-graph replays measured with CUDA events, and the device's copy
bandwidth; ``FakeTimer`` stands in on the CPU (``--dry-run``): it runs every
call once, so the code paths are exercised, and returns made-up numbers.

Method (``GpuTimer.graph``): the contender's calls (one per weight copy, so
that the weights are cold: together they exceed twice the L2) are run once
eagerly on a side stream (lazy initialisation, compilation, allocator
warm-up), then captured into ONE graph in sequence. After ``warmup`` replays,
each of ``replays`` replays is timed alone: a ``torch.cuda._sleep`` keeps the
GPU busy while the CPU enqueues the start event, the replay and the end event
(so the CPU's launch cost is hidden, as in a decode loop; the sleep is made
longer than twice the slowest ``graph.replay()`` call of the warm-up, for
graphs of thousands of nodes such as the eager DeepSeek chain), and the elapsed
time is divided by the number of calls. The warm-up replays go on for at least
``warmup_s`` (25 ms, as triton's do_bench), a precaution: an idle H200 sits at
345 MHz, and a contender is timed right after seconds of host work (compiling the
next case). The result is the median (min, p90
and all samples are kept too)."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

SLEEP_CYCLES = 200_000  # ~100 us at ~2 GHz: longer than enqueueing one graph replay (of a small graph)
SLEEP_HZ = 2.0e9  # cycles per second assumed when sizing the sleep from CPU time (H200: <= 1.98 GHz, so longer)
WARMUP_S = 0.025  # the least time of warm-up replays before the timed ones
COPY_BYTES = 2 << 30  # 2 GiB device-to-device copy for the bandwidth


def warm_clocks(launch: Callable[[int], None], seconds: float = WARMUP_S,
                sync: Callable[[], None] = torch.cuda.synchronize) -> int:
    """Call ``launch(i)`` for i = 0, 1, .. until the GPU has run them for at least ``seconds``
    (``sync`` after every 32 calls); the number of calls. For stamped launches outside a timer,
    such as the timeline scripts': an idle H200 sits at 345 MHz, and a CTA's serial code runs at
    the clock it finds (DeepSeek S = 1: the qkv CTA's partials came 1.27 us after wqkv's last
    CTA without this warm-up, 0.43 with it; bench/NOTES.md DeepSeek session 27)."""
    n, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        for _ in range(32):
            launch(n)
            n += 1
        sync()
    return n


@dataclass
class Sample:
    """Per-call microseconds of each timed replay."""

    us: list[float] = field(default_factory=list)
    fake: bool = False
    sleep_cycles: int | None = None  # the sleep before each timed replay (GpuTimer)
    warmup_replays: int | None = None  # the untimed replays before them (GpuTimer)

    @property
    def median(self) -> float:
        return statistics.median(self.us)

    def summary(self) -> dict:
        s = sorted(self.us)
        return {
            "median_us": self.median,
            "min_us": s[0],
            "p90_us": s[min(len(s) - 1, int(0.9 * len(s)))],
            "replays": len(s),
            "samples_us": self.us,
            "fake": self.fake,
            "sleep_cycles": self.sleep_cycles,
            "warmup_replays": self.warmup_replays,
        }


class GpuTimer:
    fake = False

    def __init__(self, replays: int = 50, warmup: int = 10, sleep_cycles: int = SLEEP_CYCLES, warmup_s: float = WARMUP_S):
        if replays < 1 or warmup < 0 or warmup_s < 0:
            raise ValueError("replays must be >= 1, warmup and warmup_s >= 0")
        self.replays = replays
        self.warmup = warmup
        self.sleep_cycles = sleep_cycles
        self.warmup_s = warmup_s

    @staticmethod
    def _run_eager(calls: Sequence[Callable[[], object]]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for call in calls:
                call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def graph(self, calls: Sequence[Callable[[], object]], fake_us: float | None = None) -> Sample:
        """Per-call time of ``calls`` captured in one CUDA graph (see module doc)."""
        del fake_us
        self._run_eager(calls)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        torch.cuda.synchronize()
        enqueue_s = 0.0
        n, began = 0, time.perf_counter()
        # at least `warmup` replays and warmup_s seconds; the first also uploads the graph: its
        # enqueue time not counted
        while n < max(self.warmup, 2) or time.perf_counter() - began < self.warmup_s:
            t0 = time.perf_counter()
            graph.replay()
            if n:
                enqueue_s = max(enqueue_s, time.perf_counter() - t0)
            torch.cuda.synchronize()
            n += 1
        sleep_cycles = max(self.sleep_cycles, int(2 * enqueue_s * SLEEP_HZ))
        out = Sample()
        out.sleep_cycles, out.warmup_replays = sleep_cycles, n
        for _ in range(self.replays):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(sleep_cycles)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            out.us.append(start.elapsed_time(end) * 1e3 / len(calls))
        del graph
        torch.cuda.synchronize()
        return out

    def copy_bandwidth(self, nbytes: int = COPY_BYTES, reps: int = 10) -> dict:
        """Device-to-device copy bandwidth: (bytes read + bytes written) / time
        of ``dst.copy_(src)`` over ``nbytes``, median of ``reps`` (after 2
        warm-up copies)."""
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(7)
        dst = torch.empty_like(src)
        for _ in range(2):
            dst.copy_(src)
        torch.cuda.synchronize()
        secs = []
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            secs.append(start.elapsed_time(end) / 1e3)
        del src, dst
        torch.cuda.empty_cache()
        med = statistics.median(secs)
        return {"bytes": nbytes, "moved_bytes": 2 * nbytes, "median_s": med, "samples_s": secs,
                "bytes_per_s": 2 * nbytes / med, "fake": False}


class FakeTimer:
    """The dry-run stand-in: runs each call once (eagerly, on the CPU) and
    returns ``fake_us`` (or 1.0) as every sample, flagged fake."""

    fake = True

    def __init__(self, replays: int = 3, warmup: int = 0, **_):
        self.replays = max(1, min(replays, 3))
        self.warmup = warmup

    def graph(self, calls: Sequence[Callable[[], object]], fake_us: float | None = None) -> Sample:
        for call in calls:
            call()
        us = fake_us if fake_us is not None else 1.0
        return Sample([us] * self.replays, fake=True)

    def copy_bandwidth(self, nbytes: int = COPY_BYTES, reps: int = 10) -> dict:
        """A nominal 4.0 TB/s (flagged fake); also copies 16 MiB on the CPU so
        the call shape is exercised."""
        src = torch.ones(16 << 20, dtype=torch.uint8)
        t0 = time.perf_counter()
        torch.empty_like(src).copy_(src)
        secs = time.perf_counter() - t0
        return {"bytes": nbytes, "moved_bytes": 2 * nbytes, "median_s": 2 * nbytes / 4.0e12,
                "samples_s": [secs], "bytes_per_s": 4.0e12, "fake": True}


class Watchdog:
    """Ends the process (status 3) with a diagnosis when one step of the bench runs past its
    limit. A persistent kernel whose mailbox wait is never satisfied spins forever, and a bench
    blocked on it would hold the lent machine until the command's time runs out (2026-11-30: an
    experiment that initialised an mbarrier twice). The waits that block (synchronize, event
    waits, copies to the host) release the GIL, so the timer thread runs. ``on_fire`` (e.g.
    saving what was measured so far) is called first; its errors are reported, not raised."""

    EXIT_STATUS = 3

    def __init__(self, seconds: float, on_fire: Callable[[str], None] | None = None):
        self.seconds, self.on_fire = seconds, on_fire

    @contextlib.contextmanager
    def step(self, what: str):
        """Run the block under the limit (none if ``seconds`` <= 0); ``what`` names it in the diagnosis."""
        if self.seconds <= 0:
            yield
            return
        timer = threading.Timer(self.seconds, self._fire, args=(what,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _fire(self, what: str) -> None:
        msg = (f"bench: {what} still running after {self.seconds:g} s: a launch that never ends (a persistent "
               "kernel's mailbox wait that is never satisfied?). Its debug build names the wait: run the kernel's "
               "GPU tests, or build it with debug=True (launch raises KernelHang with the stage, task and wait). "
               "Stopping (--watchdog sets the limit).")
        sys.stderr.write(msg + "\n")
        if self.on_fire is not None:
            try:
                self.on_fire(msg)
            except Exception as e:  # noqa: BLE001 - the exit must happen
                sys.stderr.write(f"bench: saving the partial results failed: {e}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(self.EXIT_STATUS)
