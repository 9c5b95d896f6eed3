"""How much programmatic dependent launch (PDL) takes off back-to-back launches (sm90 probe).

    PYTHONPATH=. python3 scripts/pdl_probe.py [--tokens=1,16,48]

DeepSeek attn_front at TP4, five ways: without PDL (`load(pdl=False)`), cooperative or not;
with PDL (the default), cooperative or not; and `wait-only`: PDL, but the kernel's
`launch_dependents()` call taken out, so every launch follows a grid that never triggers its
dependents (what a predecessor without PDL gives). Each: a CUDA graph of 20 launches in a row
(weights warm), replayed; us a launch (median of 30 replays), three rounds by turns, then the
contract check of the last launch's outputs. bench/NOTES.md, session 24, has a run."""

from __future__ import annotations

import dataclasses
import sys

import torch

import codegen
from tests import deepseek_case as dc
from tests.graphs import capture

SPEC = "deepseek_v41/attn_front"
TRIGGER = "    launch_dependents();\n"
ROUNDS = 3


def per_launch_us(kernel, args, n: int = 20, replays: int = 30) -> float:
    kernel(**args)
    torch.cuda.synchronize()
    graph = capture(lambda: kernel(**args), times=n)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n)
    return sorted(times)[len(times) // 2]


def main() -> None:
    only = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--tokens=")), "1,16,48")
    print("| S | no PDL | no PDL, not cooperative | PDL | PDL, not cooperative | wait only |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in (int(x) for x in only.split(",")):
        pdl = codegen.load(SPEC, tokens=s, tp=4)
        assert pdl.source.count(TRIGGER) == 1
        ways = {
            "no PDL": codegen.load(SPEC, tokens=s, tp=4, pdl=False),
            "no PDL, not cooperative": codegen.load(SPEC, tokens=s, tp=4, pdl=False, cooperative=False),
            "PDL": pdl,
            "PDL, not cooperative": codegen.load(SPEC, tokens=s, tp=4, cooperative=False),
            "wait only": dataclasses.replace(pdl, source=pdl.source.replace(TRIGGER, "")),
        }
        case = dc.make_case(s, 4, 1, "sm90", seed=7 + s)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(ROUNDS):
            for name, kernel in ways.items():
                args = dc.launch_args(case, kernel.workspace("cuda"))
                times[name].append(per_launch_us(kernel, args))
                dc.check(case, kernel.ir, args, epoch=kernel.ir.epoch(args["epoch"].cpu()) - 1)
        print(f"| {s} | " + " | ".join(f"{sum(t) / len(t):.2f}" for t in times.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
