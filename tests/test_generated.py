"""generated/ is what reviewers read: it must be current, and every file in it
must compile for its target (gfx942 / gfx950 through clang from ziglang with
zero spills, sm90 through nvrtc), all on a CPU-only machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from codegen import jit
from codegen.generate import GENERATED, ROOT, review_builds
from codegen.lower import lower
from codegen.render import render
from codegen.spec import load_spec
from codegen.targets import get_target

BUILDS = review_builds()


def test_generated_is_current():
    """What `make generate` would write is what generated/ holds, and nothing else."""
    for rb in BUILDS:
        text = render(lower(load_spec(rb.spec), rb.build))
        assert rb.path.exists(), f"{rb.path.relative_to(ROOT)} missing: run make generate"
        assert rb.path.read_text() == text, f"{rb.path.relative_to(ROOT)} is stale: run make generate"
    extra = set(GENERATED.rglob("*.hip")) - {rb.path for rb in BUILDS}
    assert not extra, f"files no build produces: {sorted(map(str, extra))}"


def test_make_generate_idempotent(tmp_path):
    """A second `python -m codegen generate` writes nothing."""
    out = subprocess.run([sys.executable, "-m", "codegen", "generate"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout, out.stdout


@pytest.mark.parametrize("rb", BUILDS, ids=lambda rb: rb.path.name)
def test_generated_compiles(rb):
    target = get_target(rb.target)
    reports = jit.resource_report(rb.path.read_text(), rb.path.name, target)
    assert [r.name for r in reports] == [load_spec(rb.spec).spec.c_name]
    rep = reports[0]
    assert rep.spills == 0, f"{rb.path.name}: {rep.vgpr_spills} VGPR / {rep.sgpr_spills} SGPR spills"
    assert rep.scratch_bytes == 0, f"{rb.path.name}: {rep.scratch_bytes} bytes of stack"
    fp8 = sum(n for op, n in rep.mfma.items()
              if op == target.mma or (target.native_mma and op.startswith(target.native_mma) and "e4m3" in op))
    assert fp8 > 0, f"{rb.path.name}: no {target.mma} (nor {target.native_mma or 'other fp8 MMA'}) in the code"
