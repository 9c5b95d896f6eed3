"""A MiniMax pre_attn build whose head tasks run twice in a row, for timing probes: the
second pass runs the same instructions (a loop, not unrolled) from a warm instruction cache,
its inputs already tagged, and stores the same bytes again. Stamps keep the last pass's
times, so `heads.got_point` -> `heads.stored_point` is a warm pass. The question it answers:
the head tasks take 0.35-1.2 us from their qkv values to their stores at S = 1 for ~200
instructions with no load to wait on (bench/NOTES.md, MiniMax session 32): is it the code's
first fetch? The timeline script takes it as `--heads-twice`.

    from scripts.heads_twice import heads_twice
    kernel = heads_twice(codegen.load("minimax_m3/pre_attn", ...))"""

from __future__ import annotations

from codegen.launch import Kernel

CALL = "        if (tk < TOKENS) head(a, mb, lds, ht, tk, l32);  // whole warps / half waves\n"
TWICE = ("#pragma unroll 1\n"
         "        for (int pass = 0; pass < 2; ++pass)  // probe: twice, the second from a warm instruction cache\n"
         "            if (tk < TOKENS) head(a, mb, lds, ht, tk, l32);\n")


def heads_twice_source(source: str) -> str:
    """``source`` with each head task run twice (ValueError: not a MiniMax pre_attn build)."""
    if source.count(CALL) != 1:
        raise ValueError("found no head task call: not a MiniMax pre_attn build?")
    return source.replace(CALL, TWICE)


def heads_twice(kernel: Kernel) -> Kernel:
    """The same build (IR, backend, launch mode) compiled from the probe source."""
    return kernel.with_source(heads_twice_source(kernel.source))
