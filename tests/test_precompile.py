"""codegen.precompile: builds compiled into the JIT cache by parallel processes, no GPU."""

from __future__ import annotations

import pytest

import codegen
import codegen.launch
from codegen import jit
from codegen.launch import PrecompileError

SPEC = "minimax_m3/pre_attn"


def cached(**build) -> bool:
    """Whether the build's binary is in the cache already (a miss compiles it)."""
    kernel = codegen.launch.load(SPEC, target="sm90", **build)
    return jit.compile_binary_cached(kernel.source, kernel.file_name, kernel.target)[1]


def test_precompile_fills_the_cache(tmp_path, monkeypatch):
    """Two sm90 builds compiled by two worker processes: their labels in order,
    and each build's binary then comes from the cache (a third one, never
    precompiled, does not). A build the spec refuses: PrecompileError naming it
    and the spec's located message, or kept in the list with errors="keep"."""
    monkeypatch.setenv("MONO_CACHE_DIR", str(tmp_path / "cache"))
    builds = [dict(tokens=1), dict(tokens=4, tune={"qkv.tail_read_ahead": 0})]
    labels = codegen.precompile([dict(name=SPEC, target="sm90", **b) for b in builds], workers=2)
    assert [label.split()[0] for label in labels] == ["tokens=1", "tokens=4"]
    assert all(cached(**b) for b in builds)
    assert not cached(tokens=2)

    refused = dict(name=SPEC, target="sm90", tokens=4, tune={"scores.late_ctas": 132})
    with pytest.raises(PrecompileError, match=r"pre_attn\.yaml:\d+: stages\.\d+\.late_ctas: .*132 late CTAs") as e:
        codegen.precompile([refused])
    assert "tune={'scores.late_ctas': 132}" in str(e.value)
    (kept,) = codegen.precompile([refused], errors="keep")
    assert isinstance(kept, PrecompileError) and "late_ctas" in str(kept)
    with pytest.raises(TypeError, match="has no 'name'"):
        codegen.precompile([dict(tokens=1, target="sm90")])
    with pytest.raises(ValueError, match="errors='ignore'"):
        codegen.precompile([], errors="ignore")


def test_precompile_command(tmp_path, monkeypatch, capsys):
    """`python -m codegen precompile`: each --tokens build compiled and named, the count and
    the cache folder said; a refused build named on stderr with the spec's fix, exit 1; a bad
    --tokens list refused with an example."""
    from codegen.__main__ import main

    monkeypatch.setenv("MONO_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["precompile", SPEC, "--target", "sm90", "--tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert f"compiled {SPEC} [sm90 tokens=2 " in out and f"1 of 1 builds in {tmp_path / 'cache'}" in out
    assert cached(tokens=2)
    assert main(["precompile", SPEC, "--target", "sm90", "--tokens", "4", "--tune", "scores.late_ctas=132"]) == 1
    err = capsys.readouterr().err
    assert "error: precompile(" in err and "132 late CTAs" in err and "fix: give late_ctas 0 .. 131" in err
    with pytest.raises(SystemExit, match="comma-separated list of row counts"):
        main(["precompile", SPEC, "--target", "sm90", "--tokens", "1,x"])
