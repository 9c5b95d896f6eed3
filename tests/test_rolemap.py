"""Which CTA runs which task (CPU): ``role_table`` on hand-made task tables and
on every review build, and the rolemap PNG and command."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from codegen.__main__ import main
from codegen.generate import review_builds
from codegen.lower import lower
from codegen.rolemap import Role, role_table, summary
from codegen.spec import load_spec

SPEC = "minimax_m3/pre_attn"


def stage(index, name, kind, tasks, first, ctas, placement="round_robin"):
    return SimpleNamespace(index=index, name=name, kind=kind, tasks=tasks, first=first, ctas=ctas,
                           placement=placement, waits_on=())


def fake_ir(blocks, *stages):
    return SimpleNamespace(blocks=blocks, stages=stages)


def test_role_table_by_hand():
    ir = fake_ir(
        6,
        stage(0, "norm", "rmsnorm_fp8", 2, 4, 2),            # tasks 0, 1 on CTAs 4, 5
        stage(1, "qkv", "gemv_fp8", 9, 0, 6),                # round robin over the whole grid
        stage(2, "heads", "head_norm_rope", 3, 1, 3, "fixed"),  # CTAs 1..3, one task each
    )
    table = role_table(ir)
    assert table == [
        (Role("qkv", "gemv_fp8", (0, 6)),),
        (Role("qkv", "gemv_fp8", (1, 7)), Role("heads", "head_norm_rope", (0,))),
        (Role("qkv", "gemv_fp8", (2, 8)), Role("heads", "head_norm_rope", (1,))),
        (Role("qkv", "gemv_fp8", (3,)), Role("heads", "head_norm_rope", (2,))),
        (Role("norm", "rmsnorm_fp8", (0,)), Role("qkv", "gemv_fp8", (4,))),
        (Role("norm", "rmsnorm_fp8", (1,)), Role("qkv", "gemv_fp8", (5,))),
    ]


def test_role_table_idle_ctas():
    table = role_table(fake_ir(5, stage(0, "only", "k", 2, 1, 2)))
    assert table[0] == () and table[3] == () and table[4] == ()
    assert table[2] == (Role("only", "k", (1,)),)


@pytest.mark.parametrize("rb", review_builds([SPEC]), ids=lambda rb: rb.path.name)
def test_role_table_of_review_builds(rb):
    """Every task of every stage runs exactly once, on CTA first + t % ctas, and
    each CTA's roles follow the spec's stage order."""
    ir = lower(load_spec(rb.spec), rb.build)
    table = role_table(ir)
    assert len(table) == ir.blocks
    order = [s.name for s in ir.stages]
    for s in ir.stages:
        where = {t: cta for cta, roles in enumerate(table) for r in roles if r.stage == s.name for t in r.tasks}
        assert sorted(where) == list(range(s.tasks))
        assert all(cta == s.first + t % s.ctas for t, cta in where.items())
    for roles in table:
        assert [r.stage for r in roles] == sorted((r.stage for r in roles), key=order.index)


def test_summary():
    rb = next(rb for rb in review_builds([SPEC]) if rb.target == "gfx950")
    ir = lower(load_spec(rb.spec), rb.build)
    lines = summary(ir)
    assert len(lines) == len(ir.stages) + 1 and lines[-1].startswith("idle: ")
    assert lines[0].startswith(f"{ir.stages[0].index}. {ir.stages[0].name} ({ir.stages[0].kind}): ")


def test_rolemap_command(tmp_path, capsys):
    """The command prints the table and writes the PNG (``plot_rolemap``)."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "map.png"
    assert main(["rolemap", SPEC, "--target", "sm90", "--tokens", "4", "-o", str(out), "timeline=true"]) == 0
    assert out.exists() and out.stat().st_size > 1000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "norm (rmsnorm_fp8): 4 tasks on CTAs 0..3, 1 per CTA" in text
    assert f"wrote {out}" in text


def test_rolemap_default_name(tmp_path, monkeypatch, capsys):
    """Without -o: rolemap-<kernel>.<target>.<build>.png in the working folder
    (here without drawing it)."""
    import codegen.rolemap

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(codegen.rolemap, "plot_rolemap", lambda ir, path: path)
    assert main(["rolemap", SPEC, "--tokens", "2", "timeline=true"]) == 0
    assert "wrote rolemap-minimax_m3_pre_attn.sm90.s2-timeline.png" in capsys.readouterr().out
