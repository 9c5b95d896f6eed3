"""CUDA-graph capture for the GPU tests: what every replay test repeated."""

from __future__ import annotations

from typing import Callable


def capture(call: Callable[[], object], times: int = 1, warm: bool = False):
    """A CUDA graph of ``call`` made ``times`` times in a row, captured on a side
    stream (``warm``: ``call`` runs once on that stream first and the device
    synchronizes, e.g. for compiled code). Nothing is replayed."""
    import torch

    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        if warm:
            call()
            torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(times):
                call()
    return graph
