"""How much SASS each stage and function of a sm90 build is (CPU only): the code a CTA fetches
cold the first time it runs a stage on an SM. A head task's first pass took 0.3-0.9 us more than
its second, the same instructions warm (bench/NOTES.md MiniMax session 32), so code that runs
once per SM is paid for in instruction fetches; this says where that code is.

    PYTHONPATH=. python3 scripts/code_footprint.py generated/minimax_m3/pre_attn.sm90.s16.hip [--top N]

Builds the CUBIN (nvrtc, with the line info every build carries), disassembles it with source
lines and their inline chains (`nvdisasm -gi`), and gives each instruction to the innermost
source line of its chain that lies in a stage's namespace (`namespace stage_<name> {`) and to
the function around that line; instructions of the kernel's body and the target's helpers
called from it count as `kernel`. Prints instructions and KB per stage, then the N largest
functions. Needs nvdisasm (scripts/sass_scoreboards.py says where it is looked for)."""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from scripts.sass_scoreboards import listing

INSTRUCTION_BYTES = 16  # sm90
LINE = re.compile(r'//## File "[^"]*", line (\d+)')
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.+?)\s*;")
NAMESPACE = re.compile(r"namespace stage_(\w+) \{")
FUNCTION = re.compile(r"MONO_(?:DEVICE|KERNEL)\b[^(]*?\b(\w+)\(")


def instructions(text: str) -> list[tuple[int, str, tuple[int, ...]]]:
    """Each instruction of a `-gi` listing: its offset, its SASS and its inline chain of source
    lines, innermost first. nvdisasm prints a chain as a run of `//##` lines (`line A inlined at
    line B`, then B's own, out to the kernel's); an instruction after no new run keeps the chain
    before it."""
    out: list[tuple[int, str, tuple[int, ...]]] = []
    chain: tuple[int, ...] = ()
    run: list[int] = []
    for line in text.splitlines():
        m = LINE.search(line)
        if m:
            run.append(int(m.group(1)))  # (its `inlined at` line is the next one's)
            continue
        m = INSTRUCTION.search(line)
        if m:
            if run:
                chain, run = tuple(run), []
            out.append((int(m.group(1), 16), m.group(2), chain))
    return out


def chains(text: str) -> list[tuple[int, ...]]:
    """Each instruction's inline chain of source lines, innermost first (``instructions``)."""
    return [chain for _, _, chain in instructions(text)]


def regions(source: str) -> tuple[list[str | None], list[str | None]]:
    """Each source line's (1-based index) stage namespace and enclosing function (None outside)."""
    lines = source.splitlines()
    stage: list[str | None] = [None] * (len(lines) + 1)
    func: list[str | None] = [None] * (len(lines) + 1)
    current_stage = current_func = None
    for i, line in enumerate(lines, 1):
        m = NAMESPACE.match(line)
        if m:
            current_stage = m.group(1)
        elif line.startswith("}  // namespace stage_"):
            current_stage = None
        m = FUNCTION.match(line)
        if m and not line.rstrip().endswith(";"):  # a definition, not a declaration
            current_func = m.group(1)
        stage[i], func[i] = current_stage, current_func
        if line.startswith("}") and current_func and not line.startswith("}  // namespace"):
            current_func = None
    return stage, func


def owners(source: str, text: str) -> list[tuple[str, str | None, int]]:
    """Each instruction of ``text`` (a `-gi` listing of ``source``), in address order: its stage
    (`kernel` for the kernel's body and the helpers it calls directly), its function and the
    source line it was given to: the innermost line of its chain that lies in a stage."""
    stage, func = regions(source)
    out = []
    for chain in chains(text):
        line = next((n for n in chain if 0 < n < len(stage) and stage[n]), None)
        if line is None:  # the kernel's body, or a helper it calls directly
            line = chain[0] if chain and 0 < chain[0] < len(stage) else 0
            out.append(("kernel", func[line] if line else None, line))
        else:
            out.append((stage[line], func[line], line))
    return out


def footprint(source: str, text: str) -> tuple[Counter, Counter]:
    """(instructions per stage, instructions per (stage, function)) of ``text``, a listing of ``source``."""
    per_stage: Counter = Counter()
    per_func: Counter = Counter()
    for name, fn, _ in owners(source, text):
        per_stage[name] += 1
        per_func[(name, fn)] += 1
    return per_stage, per_func


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hip", type=Path, help="a generated sm90 source (generated/*/*.sm90.*.hip)")
    ap.add_argument("--top", type=int, default=12, help="functions listed (default 12)")
    args = ap.parse_args()
    source = args.hip.read_text()
    per_stage, per_func = footprint(source, listing(source, args.hip.name, "-gi"))  # line info, inline chains
    total = sum(per_stage.values())
    print(f"{args.hip}: {total} instructions, {total * INSTRUCTION_BYTES / 1024:.0f} KB")
    print("| stage | instructions | KB | share |\n|---|---:|---:|---:|")
    for name, n in per_stage.most_common():
        print(f"| {name} | {n} | {n * INSTRUCTION_BYTES / 1024:.1f} | {100 * n / total:.0f} % |")
    print("\n| stage | function | instructions | KB |\n|---|---|---:|---:|")
    for (name, fn), n in per_func.most_common(args.top):
        print(f"| {name} | {fn} | {n} | {n * INSTRUCTION_BYTES / 1024:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
