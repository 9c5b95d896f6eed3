"""Per-stage time of one MiniMax pre_attn launch from its timeline stamps
(GPU): for each point, the median / max over CTAs of (stamp - earliest start),
in microseconds. Weights cold as in the bench: the launches rotate over enough
copies of w_qkv to overflow the L2, and the stamps are the last launch's.
Usage: python scripts/timeline_probe.py [tokens ...]"""

import sys

import torch

import codegen
from tests.minimax_case import context_case, launch_args, make_inputs


def probe(tokens: int, contexts=(4096,), reps: int = 20) -> None:
    kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, timeline=True)
    inp = make_inputs(tokens, kernel.target.name, seed=1)
    case = context_case(tokens, 1, list(contexts), seed=2)
    ws = kernel.workspace("cuda")
    args = launch_args(inp, ws)
    args.update(seq_lens=case["seq_lens"].cuda(), block_table=case["block_table"].cuda(), bt_width=case["bt_cols"],
                index_cache=case["index_cache_bytes"].cuda().view(inp["fp8"]))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(8, -(-2 * l2 // args["w_qkv"].numel()) + 1)  # together over twice the L2
    weights = [args["w_qkv"].clone() for _ in range(copies)]
    for i in range(max(reps, 2 * copies)):  # the last launch's stamps are read; its weights cold
        args["w_qkv"] = weights[i % copies]
        kernel(**args)
    torch.cuda.synchronize()
    tl = ws["tl"].cpu().double()
    pts = kernel.ir.timeline_points
    t0 = tl[:, 0][tl[:, 0] > 0].min()
    print(f"S={tokens} contexts={list(contexts)}, cold weights ({copies} copies): us from the first CTA's start, "
          "median / max over CTAs that stamp")
    for i, p in enumerate(pts):
        col = tl[:, i]
        col = (col[col > 0] - t0) / 1000.0
        if col.numel():
            print(f"  {p:14s} n={col.numel():4d}  median {col.median().item():7.2f}  max {col.max().item():7.2f}")


if __name__ == "__main__":
    for s in [int(a) for a in sys.argv[1:]] or [1, 16]:
        probe(s)
        probe(s, contexts=(65536,))
