"""Whether generated sm90 sources compile to the same SASS instructions as at another revision
(CPU only): for a change meant to leave some builds' machine code alone (a template refactor, a
knob that is off), the builds it should not touch are proven untouched without device time.

    PYTHONPATH=. python3 scripts/sass_same.py 7730f6d generated/deepseek_v41/attn_front.sm90.s16.hip ...
    PYTHONPATH=. python3 scripts/sass_same.py HEAD~1          (every generated sm90 file)

Compares the instructions only (operands included; addresses, control bits and the line table
are left out). Prints a line a file; exits 1 where any differs. Needs nvdisasm (as
scripts/sass_scoreboards.py)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from scripts import sass_scoreboards  # noqa: E402  (nvdisasm, listing)


def instructions(source: str) -> list[str]:
    """The SASS instructions of ``source``'s sm90 build, in order."""
    found = (re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line) for line in sass_scoreboards.listing(source, "k").splitlines())
    return [m.group(1).strip() for m in found if m]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the revision to compare with (a commit, a branch, HEAD~1)")
    ap.add_argument("files", nargs="*", help="generated sm90 .hip files (default: all of generated/)")
    args = ap.parse_args()
    files = args.files or sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("generated/*/*.sm90.*.hip"))
    differ = 0
    for f in files:
        old = subprocess.run(["git", "show", f"{args.rev}:{f}"], cwd=ROOT, capture_output=True, text=True)
        if old.returncode:
            print(f"{f}: not at {args.rev}")
            differ += 1
            continue
        a, b = instructions(old.stdout), instructions((ROOT / f).read_text())
        same = a == b
        differ += not same
        print(f"{f}: {'same instructions' if same else f'DIFFERENT ({len(a)} -> {len(b)} instructions)'}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
