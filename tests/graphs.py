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


def assert_slots_at(ir, scratch, epoch: int) -> None:
    """Under mailbox.advance slots: every CTA's own slot in ``scratch`` holds ``epoch`` (the next
    launch's, as the counter says), no CTA behind or ahead of the others; the other ways of
    keeping the epoch have no slots."""
    slots = ir.epoch_slots
    if slots is None:
        return
    import torch

    sectors = scratch[slots.offset: slots.offset + slots.nbytes].cpu().view(-1, ir.slot_words * 4)
    got = sectors[:, :4].contiguous().view(torch.int32).view(-1).tolist()
    assert got == [epoch] * ir.blocks, f"the CTAs' epoch slots: {sorted(set(got))}, want all {epoch}"
