"""What a sm90 build's warps wait on (CPU only): the SASS of a generated kernel with each
instruction's control bits decoded, so that a wait on a load's scoreboard shows.

sm90 tracks variable-latency results (global / shared loads, shuffles, MUFU) with six
scoreboards per warp. A load sets one ("W5": write scoreboard 5); an instruction that needs
a result names the scoreboards it waits for ("w05": 0 and 5) and waits until every operation
counted on them is done. ptxas shares scoreboards between loads, so a wait can hold a warp
for loads it does not use: on the H200 the q_inline norm's fourth partials poll waited on
wq_b's twelve weight loads this way (bench/NOTES.md, DeepSeek session 10).

    PYTHONPATH=. python3 scripts/sass_scoreboards.py generated/deepseek_v41/attn_front.sm90.s16.hip \\
        [--grep REGEX] [--context N] [--held | --false-waits]

Prints `address  wait-mask  Wwrite Rread s<stall>  instruction`; with --grep only the
instructions that match REGEX (and N lines around each); with --held only the polls and
acquire fences that also wait for global loads in flight; with --false-waits every
instruction that waits for global loads it does not use, marked where more loads follow (a
split load stream: DeepSeek session 17's wq_b weights, held up by a register once loaded
under a predicate). Needs nvdisasm, from the PyPI package nvidia-cuda-nvdisasm (or a CUDA
toolkit on PATH)."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from codegen.jit import cuda
from codegen.targets import get_target

NONE = 7  # a scoreboard index field that names no scoreboard


@dataclass(frozen=True)
class Control:
    """The control bits of one Volta..Hopper instruction (bits 105..125 of its 128)."""

    stall: int  # cycles before the next instruction issues
    yield_: bool
    write_sb: int | None  # the scoreboard its result sets
    read_sb: int | None  # the scoreboard its operand reads set (released once read)
    wait: tuple[int, ...]  # the scoreboards it waits for before issuing
    reuse: int  # operand reuse-cache flags

    def text(self) -> str:
        w = "w" + ("".join(map(str, self.wait)) or "-")
        sb = lambda i: "-" if i is None else str(i)  # noqa: E731
        return f"{w:7s} W{sb(self.write_sb)} R{sb(self.read_sb)} s{self.stall:2d}"


def decode_control(hi: int) -> Control:
    """The control bits in the high 64-bit word of an instruction (nvdisasm -hex's second word)."""
    wb, rb = (hi >> 46) & 7, (hi >> 49) & 7
    mask = (hi >> 52) & 0x3F
    return Control(stall=(hi >> 41) & 0xF, yield_=bool((hi >> 45) & 1),
                   write_sb=None if wb == NONE else wb, read_sb=None if rb == NONE else rb,
                   wait=tuple(b for b in range(6) if mask >> b & 1), reuse=(hi >> 58) & 0xF)


_INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*/\* (0x[0-9a-f]{16}) \*/")
_HIGH = re.compile(r"\s*/\* (0x[0-9a-f]{16}) \*/\s*$")


def annotate(listing: str) -> list[tuple[int, Control, str]]:
    """(address, control bits, instruction text) of each instruction of `nvdisasm -hex` output."""
    lines, out = listing.splitlines(), []
    for i, line in enumerate(lines[:-1]):
        m = _INSTR.match(line)
        hi = _HIGH.match(lines[i + 1]) if m else None
        if m and hi:
            out.append((int(m.group(1), 16), decode_control(int(hi.group(1), 16)), m.group(2)))
    return out


def _global_load(text: str) -> bool:
    """A load from global memory whose data the GEMVs stream (not a mailbox poll: .STRONG)."""
    op = text.split()[1] if text.startswith("@") else text.split()[0]
    return (op.startswith("LDG") and ".STRONG" not in op) or op == "LDGDEPBAR"  # LDGDEPBAR: cp.async groups


def _op(text: str) -> str:
    return text.split()[1] if text.startswith("@") else text.split()[0]


def _walk(rows: list[tuple[int, Control, str]]):
    """Each instruction (index, address, control bits, text) with the operations counted on each
    scoreboard before it: {scoreboard: [(address, text)]}. A straight-line walk (branches
    ignored): a scoreboard's operations are those set on it since an instruction last waited on it."""
    pending: dict[int, list[tuple[int, str]]] = {}
    for i, (addr, ctl, text) in enumerate(rows):
        yield i, addr, ctl, text, pending
        for b in ctl.wait:
            pending[b] = []
        if ctl.write_sb is not None:
            pending.setdefault(ctl.write_sb, []).append((addr, text))


def held_waits(rows: list[tuple[int, Control, str]]) -> list[str]:
    """The polls (``LDG...STRONG``) and acquire fences (``CCTL.IVALL``) that wait on a
    scoreboard on which global loads are still counted: each waits for those loads too (_walk)."""
    out = []
    for _, addr, ctl, text, pending in _walk(rows):
        op = _op(text)
        if (op.startswith("LD") and ".STRONG" in op) or op == "CCTL.IVALL":
            held = [x for b in ctl.wait for x in pending.get(b, []) if _global_load(x[1])]
            if ctl.write_sb is not None and op.startswith("LD"):  # a poll counted with them
                held += [x for x in pending.get(ctl.write_sb, []) if _global_load(x[1]) and x not in held]
            if held:
                out.append(f"{addr:05x} {op} waits for {len(held)} global load(s), e.g. {held[0][0]:05x} {held[0][1]}")
    return out


_REG = re.compile(r"\bR(\d+)(\.64)?\b")
SPLIT_WINDOW = 40  # instructions after a false wait in which another streamed load marks a split batch


def _width(op: str) -> int:
    """Registers of a load's destination (LDG.E.128: 4, .64: 2, else 1)."""
    return 4 if ".128" in op else 2 if ".64" in op else 1


def _registers(text: str) -> set[int]:
    """Every register an instruction names, its first operand with the op's width (a load's
    destination, a store's data: LDG.E.128 R20 is R20..R23), `Rn.64` as two (an over-estimate
    elsewhere, e.g. wide MMAs' operands: then a wait reads as needed, never as false)."""
    op = _op(text)
    body = text.split(None, 2 if text.startswith("@") else 1)[-1]
    regs: set[int] = set()
    for k, m in enumerate(_REG.finditer(body)):
        n, wide = int(m.group(1)), m.group(2)
        width = _width(op) if k == 0 and op.startswith(("LD", "ST")) else 2 if wide else 1
        if k == 0 and not op.startswith(("LD", "ST")) and any(w in op for w in ("WIDE", "MMA", ".64", ".128")):
            width = 8  # a wide result: assume the most (see above)
        regs.update(range(n, n + width))
    return regs


def false_waits(rows: list[tuple[int, Control, str]]) -> list[str]:
    """Instructions that wait on a scoreboard whose global loads in flight write no register
    they read or write: a wait ptxas placed because the loads share that scoreboard with
    something else (or to free it), which holds the warp for loads it does not use (the
    DeepSeek qkv stage's `LDC` of a pointer once waited for its weight-row loads this way,
    bench/NOTES.md DeepSeek session 17). Fences, barriers, polls (--held) and the loads'
    consumers are not listed. A straight-line walk (_walk)."""
    out = []
    for i, addr, ctl, text, pending in _walk(rows):
        op = _op(text)
        skip = op.startswith(("MEMBAR", "CCTL", "BAR", "WARPSYNC", "DEPBAR", "EXIT", "BRA", "RET", "CALL", "ERRBAR"))
        if skip or (op.startswith("LD") and ".STRONG" in op):
            continue
        used = _registers(text)
        for b in ctl.wait:
            counted = pending.get(b, [])
            loads = [x for x in counted if _global_load(x[1])]
            if loads and not any(_op(t).startswith("LD") and _registers(t) & used for _, t in counted):
                # more streamed loads right after it: the wait splits a batch of loads in two
                after = sum(_global_load(t) and _op(t).startswith("LDG") for _, _, t in rows[i:i + SPLIT_WINDOW])
                split = f" (splits a load batch: {after} more within {SPLIT_WINDOW} instructions)" if after else ""
                out.append(f"{addr:05x} {text}  waits on scoreboard {b} for {len(loads)} global load(s) it does "
                           f"not use{split}, e.g. {loads[0][0]:05x} {loads[0][1]}")
    return out


def nvdisasm() -> str:
    """The nvdisasm executable: on PATH, or inside the nvidia-cuda-nvdisasm package."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's PyPI wheels
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for exe in sorted(Path(root).glob("cu*/bin/nvdisasm")) + sorted(Path(root).glob("cuda_nvdisasm/bin/nvdisasm")):
            return str(exe)
    sys.exit("sass_scoreboards: no nvdisasm: `pip install nvidia-cuda-nvdisasm` (or put a CUDA toolkit's bin on PATH)")


def listing(source: str, name: str, mode: str = "-hex") -> str:
    """`nvdisasm <mode>` of the sm90 CUBIN of ``source`` (-hex: the control words; -gi: source lines
    with their inline chains, scripts/code_footprint.py)."""
    cubin = cuda.compile(source, name, get_target("sm90"))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm(), mode, "-c", f.name], check=True, capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="a generated sm90 .hip file")
    ap.add_argument("--grep", help="only instructions matching this regex (e.g. 'LDG|BAR|MEMBAR')")
    ap.add_argument("--context", type=int, default=0, help="instructions shown around each match")
    ap.add_argument("--held", action="store_true",
                    help="only list the polls and acquire fences that also wait for global loads in flight")
    ap.add_argument("--false-waits", action="store_true",
                    help="only list the instructions that wait for global loads whose registers they do not touch")
    args = ap.parse_args()
    rows = annotate(listing(Path(args.file).read_text(), Path(args.file).name))
    if args.held:
        print("\n".join(held_waits(rows)) or "no poll or acquire fence waits for a global load")
        return
    if args.false_waits:
        print("\n".join(false_waits(rows)) or "no instruction waits for global loads it does not use")
        return
    keep = range(len(rows))
    if args.grep:
        pat = re.compile(args.grep)
        hits = [i for i, (_, _, text) in enumerate(rows) if pat.search(text)]
        keep = sorted({j for i in hits for j in range(max(0, i - args.context), min(len(rows), i + args.context + 1))})
    for i in keep:
        addr, ctl, text = rows[i]
        print(f"{addr:05x}  {ctl.text()}  {text}")


if __name__ == "__main__":
    main()
