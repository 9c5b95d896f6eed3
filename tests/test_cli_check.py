"""``python -m codegen check``: a bad spec exits 1 with ``<file>:<line>: ...``
first on stderr and no traceback; a good spec exits 0."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.__main__ import main
from tests.test_bad_specs import BAD, BASE, BASES, expectation

ROOT = Path(__file__).resolve().parents[1]


def run_check(tmp_path: Path, source: Path, name: str) -> subprocess.CompletedProcess:
    shutil.copy(source, tmp_path / name)
    return subprocess.run([sys.executable, "-m", "codegen", "check", name], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


@pytest.mark.parametrize("stem", ["yaml_tab", "type_threads_word", "wait_on_later_stage", "lds_over_budget",
                                  "ds_kt_pos_wrong_dtype", "ds_mxq_out_region_too_small"])
def test_check_bad_spec_subprocess(tmp_path, stem):
    source = next(p for p in BAD if p.stem == stem)
    line, fragment = expectation(source)
    out = run_check(tmp_path, source, "bad.yaml")
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith(f"bad.yaml:{line}: "), out.stderr
    assert fragment in out.stderr.splitlines()[0]
    assert "Traceback" not in out.stderr and out.stdout == ""


@pytest.mark.parametrize("base", BASES, ids=lambda p: p.stem)
def test_check_good_spec_subprocess(tmp_path, base):
    out = run_check(tmp_path, base, "good.yaml")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("good.yaml: ok"), out.stdout
    assert out.stderr == ""


def test_check_every_bad_spec_in_process(capsys, monkeypatch):
    """The same, in process, for every file of tests/bad_specs (and the good
    base together with them: one bad file makes the whole run exit 1)."""
    monkeypatch.chdir(ROOT)
    for path in BAD:
        line, fragment = expectation(path)
        rel = str(path.relative_to(ROOT))
        assert main(["check", rel]) == 1, rel
        err = capsys.readouterr().err
        assert err.startswith(f"{rel}:{line}: "), err
        assert fragment in err and "Traceback" not in err
    assert main(["check", str(BASE.relative_to(ROOT)), str(BAD[0].relative_to(ROOT))]) == 1
    out = capsys.readouterr()
    assert "norm_gemv.yaml: ok" in out.out and out.err.startswith(str(BAD[0].relative_to(ROOT)))


def test_check_missing_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["check", "nope.yaml"]) == 1
    assert capsys.readouterr().err.startswith("nope.yaml:1: ")
