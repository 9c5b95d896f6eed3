"""Does programmatic dependent launch (PDL) shorten back-to-back launches? (sm90 probe)

    PYTHONPATH=. python3 scripts/pdl_probe.py

For DeepSeek attn_front S = 1 / 16 / 48 (TP4): the spec's source as is, and the same source with
`griddepcontrol.launch_dependents` + `griddepcontrol.wait` as the kernel body's first two
instructions (every memory access after the wait: the previous grid has completed and its
writes are visible, so the epoch protocol is untouched). The plain build launches as the
package does (cooperative); the PDL build through cuLaunchKernelEx with
PROGRAMMATIC_STREAM_SERIALIZATION (and COOPERATIVE where the driver takes both). Each: a CUDA
graph of 20 launches in a row, replayed; us per launch (median of 30 replays), then the
contract check of the last launch's outputs; three rounds. `wait-coop`: the wait alone, no trigger,
so each launch follows a grid that never triggers (a predecessor without PDL)."""

from __future__ import annotations

import dataclasses

import torch

import codegen
from codegen.jit import cuda as jcuda
from codegen.jit._launch import pack_args
from tests import deepseek_case as dc
from tests.graphs import capture

SPEC = "deepseek_v41/attn_front"
HOOK = "    MONO_LDS_DECL(lds, LDS_BYTES);\n"
WAIT = '    asm volatile("griddepcontrol.wait;" ::: "memory");  // the previous one complete, its writes visible\n'
PDL = HOOK + '    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the next launch may start\n' + WAIT


def pdl_launch(fn, grid, block, smem, stream, args, cooperative):
    d = jcuda._driver()
    cfg = d.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
    cfg.sharedMemBytes = int(smem)
    cfg.hStream = d.CUstream(int(stream))
    attrs = []
    a = d.CUlaunchAttribute()
    a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    a.value.programmaticStreamSerializationAllowed = 1
    attrs.append(a)
    if cooperative:
        c = d.CUlaunchAttribute()
        c.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        c.value.cooperative = 1
        attrs.append(c)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    jcuda._driver_call("cuLaunchKernelEx", cfg, fn.handle, pack_args(args), 0)


def timed(kernel, args, launch, n=20, replays=30):
    launch(kernel, args)
    torch.cuda.synchronize()
    graph = capture(lambda: launch(kernel, args), times=n)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / n)
    return sorted(times)[len(times) // 2]


def main() -> None:
    rows = []
    for s in (1, 16, 48):
        plain = codegen.load(SPEC, tokens=s, tp=4)
        assert plain.source.count(HOOK) == 1
        pdl = dataclasses.replace(plain, source=plain.source.replace(HOOK, PDL))
        wait = dataclasses.replace(plain, source=plain.source.replace(HOOK, HOOK + WAIT))
        case = dc.make_case(s, 4, 1, "sm90", seed=7 + s)
        out = {}
        for name, k in [(f"{n}{r}", k) for r in range(3) for n, k in (
                ("plain", plain), ("plain-nc", plain), ("pdl-coop", pdl), ("pdl", pdl), ("wait-coop", wait),
                ("wait", wait))]:
            args = dc.launch_args(case, k.workspace("cuda"))

            def launch(k, args, name=name):
                packed = k.pack(args)
                fn = k.compile()
                stream = torch.cuda.current_stream().cuda_stream
                if name.startswith("plain"):
                    fn.launch(k.ir.blocks, k.ir.threads, k.dynamic_lds, stream, packed, cooperative="-nc" not in name)
                else:
                    pdl_launch(fn, k.ir.blocks, k.ir.threads, k.dynamic_lds, stream, packed, "coop" in name)
            try:
                out[name] = timed(k, args, launch)
                dc.check(case, k.ir, args, epoch=k.ir.epoch(args["epoch"].cpu()) - 1)
            except Exception as e:  # noqa: BLE001 (a probe: report and go on)
                out[name] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append((s, out))
        print(f"S={s}: " + "  ".join(f"{k} {v:.2f} us" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()),
              flush=True)
    print("| S | " + " | ".join(n for n in rows[0][1] if n.endswith("0")) + " |")
    for s, out in rows:  # the mean of the rounds
        names = [n[:-1] for n in out if n.endswith("0")]
        vals = [[out[f"{n}{r}"] for r in range(3)] for n in names]
        print(f"| {s} | " + " | ".join(f"{sum(v) / 3:.2f}" if all(isinstance(x, float) for x in v) else "err" for v in vals) + " |")


if __name__ == "__main__":
    main()
