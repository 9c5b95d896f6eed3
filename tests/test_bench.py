"""The benchmark harness on the CPU (``python -m bench.run --dry-run``): every
code path but the timing, and a guard that fails when a contender is wrong."""

from __future__ import annotations

import json

import pytest
import torch

from bench import report
from bench.case import GuardError
from bench.minimax import PreAttnCase, pre_attn_bytes
from bench.run import auto_copies, main


def test_bytes():
    b = pre_attn_bytes(1)
    assert b["weight"] == 2560 * 6144 and b["weight_scales"] == 2560 * 4
    assert b["total"] == 15_793_152
    assert pre_attn_bytes(4)["total"] == 15_919_104 and pre_attn_bytes(16)["total"] == 16_422_912


def test_auto_copies():
    per_copy = 2560 * 6144 + 2560 * 4
    assert auto_copies(50 << 20, per_copy) == 8
    n = auto_copies(60 << 20, per_copy)
    assert n * per_copy > 2 * (60 << 20)


def test_dry_run(tmp_path):
    out = tmp_path / "out"
    assert main(["--dry-run", "--kernels", "minimax", "--tokens", "1", "--copies", "1", "--no-jit", "--no-generate",
                 "--no-plot", "--out", str(out)]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert [c["tokens"] for c in data["cases"]] == [1]
    for c in data["cases"]:
        assert c["guard"] and all(v["ok"] for v in c["guard"].values())
        assert {"ours_us", "eager_us", "compile_us", "floor_us"} <= set(c)
    assert data["meta"]["dry_run"] and data["copy_bandwidth"]["fake"]
    entry = (out / "RESULTS-entry.md").read_text()
    assert "DRY RUN" in entry and "| 1 |" in entry
    assert (out / "RESULTS.md").exists()


def test_guard_catches_wrong_outputs():
    """The guard passes on the reference's values and fails on a qkv value 8
    bf16 ulps off (on its row's largest value) or an h_out 1 ulp off."""
    case = PreAttnCase(2, copies=1, gemm="dequant", dry_run=True)
    assert all(v["ok"] for v in case.guard().values())
    good = case._standin_want
    bad = good["qkv"].clone()
    r = int(bad[1].abs().argmax())
    bad[1, r] = (bad[1, r] * 1.0625).bfloat16().float()
    case._standin_want = dict(good, qkv=bad)
    with pytest.raises(GuardError, match="qkv"):
        case.guard()
    h = good["h_out"].clone()
    h.view(torch.int16)[0, 7] += 1
    case._standin_want = dict(good, h_out=h)
    with pytest.raises(GuardError, match="h_out"):
        case.guard()


def test_table_without_compile():
    rows = [{"tokens": 1, "ours_us": 8.0, "eager_us": 40.0, "compile_us": None, "floor_us": 4.0}]
    text = report.format_table(rows)
    assert "n/a" in text and "2.00" in text
    assert report.markdown_table(rows).count("|") > 10
