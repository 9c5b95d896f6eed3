"""Launching a release build from a test or script that must not hang: a kernel
stuck in a mailbox wait (a bug, or a build without ``debug``'s bounded waits)
ends the process with a message instead of blocking everything after it."""

from __future__ import annotations

import os
import sys
import time


def launch_and_wait(kernel, args: dict, hang_s: float, bound=None) -> None:
    """Launch ``kernel`` on ``args`` (or ``bound()``: its ``kernel.bind`` launcher) and wait for
    it; still running after ``hang_s`` seconds: print which build hung and exit the process
    (status 3)."""
    import torch

    if bound is not None:
        bound()
    else:
        kernel(**args)
    done = torch.cuda.Event()
    done.record()
    t0 = time.time()
    while not done.query():
        if time.time() - t0 > hang_s:
            print(f"HANG: {kernel.ir.kernel} [{kernel.ir.build.label()}] still running after {hang_s} s",
                  file=sys.stderr, flush=True)
            os._exit(3)
        time.sleep(0.001)


TEST_HANG_S = 30.0  # a test launch still running after this long waits on a flag that never comes


def launch(kernel, args: dict, bound=None) -> None:
    """The GPU tests' launch: launch_and_wait with TEST_HANG_S (a kernel stuck in a wait would
    block every later test; the process ends with a message naming the build instead)."""
    launch_and_wait(kernel, args, TEST_HANG_S, bound)
