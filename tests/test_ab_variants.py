"""scripts/ab_variants.py (builds side by side on the lent GPU) on the CPU: its argument checks,
its table, and one dry run end to end (two variants, one with a spec override, two rounds)."""

from __future__ import annotations

import pytest

from scripts import ab_variants


def test_table_means_and_spreads():
    text = ab_variants.table({"a": [{"1": 10.0, "16": 20.0}, {"1": 10.5, "16": 19.0}],
                              "b": [{"1": 9.0}, {}]})
    assert text.splitlines() == ["| variant | 1 | 16 |", "|---|---:|---:|",
                                 "| a | 10.25 (0.50) | 19.50 (1.00) |", "| b | 9.00 | - |"]
    assert ab_variants.case_label({"tokens": 4, "context": 65536}) == "4/64K"
    assert ab_variants.case_label({"tokens": 4, "context": None}) == "4"


@pytest.mark.parametrize("argv,message", [
    (["--variant", "x"], "--variant x: NAME DIR [TUNE ...] expected"),
    (["--variant", "x", "nowhere"], "nowhere is no checkout"),
    (["--variant", "x", ".", "symbols"], "'symbols' is no STAGE.FIELD=VALUE override"),
    (["--variant", "x", ".", "--variant", "x", "."], "variant names must differ"),
])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        ab_variants.parse_args(argv)
    assert message in capsys.readouterr().err


def test_dry_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    rc = ab_variants.main(["--dry-run", "--bench", "--kernels deepseek --tokens 3 --copies 1",
                           "--variant", "spec", ".", "--variant", "one-a-task", ".", "symbols.QKV_PER_TASK=1"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.count("== spec (round") == 2 and "== one-a-task (round 2): 3:" in printed
    table = (tmp_path / "variants.md").read_text()
    assert "| spec | " in table and "| one-a-task | " in table and "(0.00)" in table
    assert (tmp_path / "variants.log").read_text().count("--tune symbols.QKV_PER_TASK=1") == 2
