"""Review tooling on the CPU: co-residency arithmetic, the report's columns,
diffs between builds and targets, and the diff against a git revision (in a
throwaway repository, so the project's own is never touched)."""

from __future__ import annotations

import json
import subprocess

import pytest

from codegen.__main__ import main
from codegen.generate import ROOT, review_builds
from codegen.lower import lower
from codegen.render import render, source
from codegen.review import co_residency, diff_builds, diff_rev, format_changes, unified
from codegen.spec import load_spec

SPEC = "minimax_m3/pre_attn"


# ---- co-residency ----------------------------------------------------------------------


@pytest.mark.parametrize("waves_per_simd, lds, want, limiter", [
    (8, 14624, 4, "registers"),   # 8 waves x 4 SIMDs / 8 waves a CTA; LDS allows 4 too (registers first)
    (5, 14624, 2, "registers"),   # 20 wave slots / 8
    (8, 33104, 1, "lds"),         # 64 KiB / 33104 B
    (1, 0, 0, "registers"),       # a CTA of 8 waves needs 2 per SIMD
])
def test_co_residency_gfx942(waves_per_simd, lds, want, limiter):
    co = co_residency("gfx942", 512, 0, waves_per_simd, lds)
    assert (co.per_cu, co.limiter) == (want, limiter)


def test_co_residency_gfx950_has_more_lds():
    assert co_residency("gfx950", 512, 0, 8, 33104).per_cu == 4  # 160 KiB / 33104 B, registers 4
    assert co_residency("gfx950", 512, 0, 8, 107072).limits["lds"] == 1


@pytest.mark.parametrize("regs, threads, lds, want, limiter", [
    (128, 512, 115264, 1, "registers"),  # 128 x 512 = 65536
    (64, 512, 22816, 2, "registers"),    # 32768 a CTA; shared memory allows 228K / 23840 = 9
    (61, 512, 22816, 2, "registers"),    # rounded up to 64 registers a thread
    (24, 512, 0, 4, "threads"),          # 2048 threads per SM (registers allow 5)
    (32, 256, 100 * 1024, 2, "lds"),     # 228 KiB / (100 KiB + the 1 KiB reserve)
    (16, 32, 0, 32, "ctas"),             # at most 32 CTAs per SM
    (168, 512, 0, 0, "registers"),       # does not fit at all
])
def test_co_residency_sm90(regs, threads, lds, want, limiter):
    co = co_residency("sm90", threads, regs, 0, lds)
    assert (co.per_cu, co.limiter) == (want, limiter)
    assert co.grid_fits(132, 132) == (want >= 1)


def test_report_rows_have_co_residency(capsys):
    """sm90 only (nvrtc, cached): the columns are there and agree with the IR."""
    assert main(["report", SPEC, "--target", "sm90", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["build"] for r in rows] == [rb.path.name for rb in review_builds([SPEC]) if rb.target == "sm90"]
    for r in rows:
        ir = lower(load_spec(SPEC), next(rb.build for rb in review_builds([SPEC]) if rb.path.name == r["build"]))
        assert r["mailbox_bytes"] == ir.scratch_bytes and r["blocks"] == ir.blocks == 132
        co = co_residency("sm90", ir.threads, r["vgprs"], 0, ir.lds_bytes)
        assert r["ctas_per_cu"] == co.per_cu >= 1 and r["co_residency_limiter"] == co.limiter
        assert r["co_resident_ctas"] == co.per_cu * 132 and r["grid_fits"] is True
    assert main(["report", SPEC, "--target", "sm90"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "CTAs/CU" in table[0] and "mailbox" in table[0]
    assert all(f"132/{r['co_resident_ctas']} ok" in line for r, line in zip(rows, table[1:]))


# ---- diffs between builds and targets --------------------------------------------------


def test_unified_equal_and_different():
    assert unified("a\nb\n", "a\nb\n", "x", "y") == ""
    d = unified("a\nb\n", "a\nc", "x", "y")
    assert d.startswith("--- x\n+++ y\n") and "-b\n" in d and "+c\n\\ No newline at end of file\n" in d


def test_diff_builds_tokens():
    d = diff_builds(SPEC, {"tokens": 1}, {"tokens": 4})
    assert d.startswith(f"--- a/{SPEC}.sm90.s1.hip\n+++ b/{SPEC}.sm90.s4.hip\n")
    assert "-// build:  tokens=1 " in d and "+// build:  tokens=4 " in d
    assert "+constexpr int TOKENS = 4;" in d
    assert diff_builds(SPEC, {"tokens": 3}, {"tokens": 3}) == ""


def test_diff_builds_targets():
    d = diff_builds(SPEC, {"tokens": 16}, {"tokens": 16}, "gfx942", "gfx950")
    assert f"--- a/{SPEC}.gfx942.s16.hip" in d and f"+++ b/{SPEC}.gfx950.s16.hip" in d
    assert "+// minimax_m3/pre_attn for gfx950 (MI355X)" in d


def test_diff_cli(capsys):
    assert main(["diff", SPEC, "--a", "tokens=1", "--b", "tokens=4", "-U", "0"]) == 0
    out = capsys.readouterr().out
    assert "+constexpr int TOKENS = 4;" in out and "@@" in out
    assert main(["diff", SPEC, "--tokens", "2", "--target-a", "sm90", "--target-b", "gfx942", "--exit-code"]) == 1
    assert "+++ b/minimax_m3/pre_attn.gfx942.s2.hip" in capsys.readouterr().out
    assert main(["diff", SPEC, "--a", "tokens=2", "--b", "tokens=2", "--exit-code"]) == 0
    assert "render the same source" in capsys.readouterr().err
    assert main(["diff", SPEC, "--a", "tokens=99", "--b", "tokens=1"]) == 1
    assert "tokens=99" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="needs a spec"):
        main(["diff", "--a", "tokens=1"])


# ---- diff against a git revision -------------------------------------------------------


def _git(repo, *args):
    out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                         cwd=repo, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def repo(tmp_path):
    """A throwaway repository whose HEAD has: one review build with a line
    changed, one review build missing, and a file no build produces."""
    builds = [rb for rb in review_builds([SPEC]) if rb.target == "sm90"]
    texts = {rb.path.relative_to(ROOT).as_posix(): render(lower(load_spec(SPEC), rb.build)) for rb in builds}
    changed, missing = sorted(texts)[0], sorted(texts)[1]
    files = dict(texts)
    files[changed] = texts[changed].replace("constexpr int THREADS", "constexpr int THREADS_OLD", 1)
    del files[missing]
    files["generated/minimax_m3/pre_attn.sm90.s7.hip"] = "// a review build removed since\n"
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "old")
    return tmp_path, changed, missing, texts


def test_diff_rev(repo):
    root, changed, missing, texts = repo
    text, changes = diff_rev("HEAD", [SPEC], root=root)
    sm90 = {c.path: c for c in changes if ".sm90." in c.path}
    assert sm90[changed].status == "M" and sm90[changed].stale  # on disk: the old text
    assert sm90[missing].status == "A" and sm90[missing].stale
    assert sm90["generated/minimax_m3/pre_attn.sm90.s7.hip"].status == "D"
    unchanged = set(texts) - {changed, missing}
    assert not unchanged & set(sm90), "a build equal at HEAD is not listed"
    assert f"--- a/{changed}\n+++ b/{changed}\n" in text
    assert "-constexpr int THREADS_OLD" in text and "+constexpr int THREADS " in text
    assert f"--- /dev/null\n+++ b/{missing}\n" in text
    assert "+++ /dev/null" in text and "-// a review build removed since" in text
    # the other targets' builds are new there
    assert {c.status for c in changes if ".sm90." not in c.path} == {"A"}
    summary = format_changes("HEAD", changes)
    assert f"  M {changed}  (generated/ is stale: run make generate)" in summary


def test_diff_rev_refuses_unknown_revision(repo):
    root = repo[0]
    with pytest.raises(ValueError, match="not a git revision"):
        diff_rev("no-such-rev", [SPEC], root=root)


def test_diff_rev_of_the_project(capsys):
    """The real repository, read with git show: --stat lists the files."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("the project is not a git checkout here")
    assert main(["diff", SPEC, "--rev", "HEAD", "--stat"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(("generated files changed since HEAD", "generated source unchanged since HEAD"))


def test_show_and_diff_agree():
    """The b side of a diff is what `show` prints for that build."""
    _, text = source(SPEC, "sm90", tokens=4)
    d = diff_builds(SPEC, {"tokens": 4}, {"tokens": 4, "timeline": True}, context=len(text.splitlines()))
    kept = [line[1:] for line in d.splitlines()[3:] if line.startswith((" ", "-"))]
    assert kept == text.splitlines()
