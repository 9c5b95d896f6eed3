"""The spec layer: the real spec loads; malformed specs (textual edits of the
real one) are refused with located errors, ``file:line: field.path: message``
and a ``fix:`` hint, whose line is the line of the edit."""

from __future__ import annotations

import re

import pytest

from codegen.spec import SpecError, load_spec, parse_spec
from codegen.spec.load import spec_path

SPEC = "minimax_m3/pre_attn"
TEXT = spec_path(SPEC).read_text()


def edit(text: str, old: str, new: str) -> str:
    """``text`` with the single occurrence of ``old`` replaced by ``new``."""
    assert text.count(old) == 1, f"edit anchor {old!r} is not unique in the spec"
    return text.replace(old, new)


def line_of(text: str, mark: str) -> int:
    """The 1-based line of ``text`` holding ``mark`` (which must be on exactly one line)."""
    hits = [n for n, line in enumerate(text.splitlines(), 1) if mark in line]
    assert len(hits) == 1, f"mark {mark!r} is on lines {hits}"
    return hits[0]


# ---- the valid spec ------------------------------------------------------------------


def test_valid_spec_loads():
    loaded = load_spec(SPEC)
    spec = loaded.spec
    assert spec.kernel == SPEC
    assert spec.c_name == "minimax_m3_pre_attn"
    assert [s.name for s in spec.stages] == ["norm", "qkv"]
    assert [s.kind for s in spec.stages] == ["rmsnorm_fp8", "gemv_fp8"]
    assert spec.params["tokens"].type == "int"
    assert spec.params["tokens"].allowed() == list(range(1, 17))
    assert spec.grid.threads == 512
    assert {a.name for a in spec.abi} >= {"scratch", "step", "layer"}
    assert [r.name for r in spec.scratch] == ["qkv", "x8", "x8s"]
    assert loaded.text == TEXT


def test_valid_spec_positions_and_comments():
    loaded = load_spec(SPEC)
    assert loaded.positions.line_of(("grid", "threads")) == line_of(TEXT, "  threads: 512")
    assert loaded.positions.line_of(("stages", 1, "tasks")) == line_of(TEXT, "tasks: QKV_ROWS // 16")
    assert loaded.positions.line_of(("stages", 1, "waits_on", 0)) == line_of(TEXT, "waits_on: [norm]")
    # an unknown child falls back to its nearest located ancestor
    assert loaded.positions.line_of(("stages", 1, "nope", 3)) == line_of(TEXT, "- name: qkv")
    assert loaded.comment(("symbols", "HIDDEN")) == "model hidden size"
    assert loaded.comment(("symbols", "HEAD_DIM")) == ""


def test_parse_spec_of_unchanged_text_is_valid():
    assert parse_spec(TEXT, "good.yaml").spec == load_spec(SPEC).spec


def test_unknown_spec_name():
    with pytest.raises(ValueError, match="no spec 'minimax_m3/nope'"):
        load_spec("minimax_m3/nope")


def test_spec_must_be_a_mapping():
    with pytest.raises(SpecError) as e:
        parse_spec("- just\n- a list\n", "bad.yaml")
    assert str(e.value).startswith("bad.yaml:1: ")


# ---- malformed specs -------------------------------------------------------------------

# (id, edit (old, new), mark: text on the line the first issue must name, message fragment)
CASES = [
    ("yaml-syntax", ("  threads: 512\n", "  threads: 512: x\n"), "threads: 512: x", "YAML syntax"),
    ("duplicate-key", ("  threads: 512\n", "  threads: 512\n  threads: 256\n"), "threads: 256", "duplicate key 'threads'"),
    ("wrong-type", ("  threads: 512\n", '  threads: "many"\n'), 'threads: "many"', "valid integer"),
    ("unknown-field", ("    tasks: tokens\n", "    taskz: tokens\n"), "taskz: tokens", "Extra inputs are not permitted"),
    ("unknown-stage-kind", ("    kind: gemv_fp8\n", "    kind: gemv_fp16\n"), "kind: gemv_fp16", "'gemv_fp16'"),
    ("stage-without-kind", ("    kind: gemv_fp8\n", ""), "- name: qkv", "'kind'"),
    ("unknown-symbol", ("tasks: QKV_ROWS // 16", "tasks: QKV_ROW // 16"), "QKV_ROW //", "unknown symbol 'QKV_ROW'"),
    ("unknown-symbol-in-symbols", ("INDEX_HEADS) * HEAD_DIM", "INDEX_HEADS) * HEAD_DIMS"), "QKV_ROWS:", "unknown symbol 'HEAD_DIMS'"),
    ("unparsable-expression", ("tasks: QKV_ROWS // 16", "tasks: QKV_ROWS //"), "tasks: QKV_ROWS //", "cannot parse expression"),
    ("unparsable-symbol", ("  HEAD_DIM: 128\n", "  HEAD_DIM: 128 +* 2\n"), "HEAD_DIM: 128 +* 2", "cannot parse expression"),
    ("unsupported-name-call", ("tasks: QKV_ROWS // 16", "tasks: abs(QKV_ROWS) // 16"), "abs(QKV_ROWS)", "unknown symbol 'abs'"),
    ("default-outside-values", ("    default: 1\n", "    default: 99\n"), "default: 99", "not among values"),
    ("default-wrong-type", ("    default: false\n", "    default: 3\n"), "default: 3", "not of type bool"),
    ("bad-range", ("values: 1..16", "values: 16..1"), "values: 16..1", "'16..1' is empty"),
    ("malformed-range", ("values: 1..16", "values: 1-16"), "values: 1-16", "must look like 'lo..hi'"),
    ("abi-name-twice", ("{name: res, dtype", "{name: ar, dtype"), "{name: ar, dtype: bf16, shape: [tokens, HIDDEN], doc: residual in}", "ABI name 'ar' used twice"),
    ("abi-bad-dtype", ("{name: s_qkv, dtype: f32", "{name: s_qkv, dtype: f16"), "dtype: f16", "'bf16'"),
    ("param-shadows-symbol", ("  eps:\n", "  HIDDEN:   # clash\n    type: int\n    default: 1\n  eps:\n"), "# clash", "both a symbol and a parameter"),
    ("scratch-region-twice", ("{name: x8s, kind", "{name: x8, kind"), "{name: x8, kind: pairs", "scratch region 'x8' defined twice"),
    ("stage-name-twice", ("  - name: qkv\n", "  - name: norm   # again\n"), "# again", "stage name 'norm' used twice"),
    ("waits-on-itself", ("waits_on: [norm]", "waits_on: [qkv]"), "waits_on: [qkv]", "waits on itself"),
    ("waits-on-later", ("    kind: rmsnorm_fp8\n", "    kind: rmsnorm_fp8\n    waits_on: [qkv]\n"), "waits_on: [qkv]", "waits on later stage 'qkv'"),
    ("waits-on-unknown", ("waits_on: [norm]", "waits_on: [nrom]"), "waits_on: [nrom]", "waits on unknown stage 'nrom'"),
    ("missing-tokens-param", ("  tokens:\n    type: int", "  ntokens:\n    type: int"), "params:", "must define 'tokens'"),
    ("tokens-param-not-int", ("  tokens:\n    type: int\n    values: 1..16\n    default: 1\n", "  tokens:\n    type: float\n    default: 1.0\n"), "params:", "must define 'tokens'"),
    ("missing-timeline-start", ("timeline_points: [start, ", "timeline_points: ["), "timeline_points:", "timeline point 'start' is missing"),
    ("timeline-point-twice", ("gemv_done, stages_done]", "gemv_done, gemv_done, stages_done]"), "timeline_points:", "listed twice"),
    ("review-build-unknown-param", ("  - {tokens: 4}\n", "  - {tokenz: 4}\n"), "{tokenz: 4}", "unknown build parameter 'tokenz'"),
    ("review-build-value-not-allowed", ("  - {tokens: 4}\n", "  - {tokens: 40}\n"), "{tokens: 40}", "40 not allowed"),
    ("bad-kernel-name", ("kernel: minimax_m3/pre_attn", "kernel: MiniMax/pre-attn"), "kernel: MiniMax", "should match pattern"),
    ("missing-grid", ("grid:\n  threads: 512\n", "gridd:\n  threads: 512\n"), "gridd:", "Extra inputs are not permitted"),
]


def _mutated(case) -> str:
    _, (old, new), _, _ = case
    return edit(TEXT, old, new)


def test_cases_are_many_and_distinct():
    assert len(CASES) >= 15
    assert len({c[0] for c in CASES}) == len(CASES)
    assert len({_mutated(c) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_spec_is_located(case):
    _, _, mark, fragment = case
    text = _mutated(case)
    expected = line_of(text, mark)
    with pytest.raises(SpecError) as excinfo:
        parse_spec(text, "bad.yaml")
    err = excinfo.value
    assert err.issues, "SpecError without issues"
    first = err.issues[0]
    assert first.file == "bad.yaml"
    assert first.line == expected, f"first issue at line {first.line}, expected {expected}:\n{err}"
    assert fragment in first.message, f"{fragment!r} not in {first.message!r}"

    # str(SpecError): one `file:line: field.path: message` per issue, each hint on a `    fix:` line
    lines = str(err).splitlines()
    assert lines[0].startswith(f"bad.yaml:{expected}: ")
    heads = [ln for ln in lines if not ln.startswith("    fix: ")]
    assert len(heads) == len(err.issues)
    for issue, head in zip(err.issues, heads):
        field = ".".join(str(p) for p in issue.loc) or "<spec>"
        assert head.startswith(f"bad.yaml:{issue.line}: {field}: ")
        assert re.match(r"^bad\.yaml:\d+: \S+: .+", head)
    for issue in err.issues:
        block = str(issue)
        if issue.hint:
            assert block.endswith(f"\n    fix: {issue.hint}")
            assert f"    fix: {issue.hint}" in lines
        else:
            assert "fix:" not in block


def test_hints_where_known():
    """The common mistakes come with a fix line."""
    expect_hint = {"yaml-syntax", "duplicate-key", "wrong-type", "unknown-field", "unknown-stage-kind",
                   "unknown-symbol", "abi-name-twice", "scratch-region-twice", "waits-on-itself",
                   "waits-on-later", "waits-on-unknown", "missing-timeline-start", "review-build-unknown-param"}
    for case in CASES:
        if case[0] not in expect_hint:
            continue
        with pytest.raises(SpecError) as excinfo:
            parse_spec(_mutated(case), "bad.yaml")
        assert "\n    fix: " in str(excinfo.value), case[0]
        assert excinfo.value.issues[0].hint, case[0]


def test_typo_reports_the_misspelling_before_the_missing_field():
    text = edit(TEXT, "    tasks: tokens\n", "    taskz: tokens\n")
    with pytest.raises(SpecError) as excinfo:
        parse_spec(text, "bad.yaml")
    locs = [i.loc for i in excinfo.value.issues]
    assert locs == [("stages", 0, "taskz"), ("stages", 0, "tasks")]
    assert excinfo.value.issues[1].line == line_of(text, "- name: norm")


def test_all_problems_reported_at_once():
    text = edit(TEXT, "waits_on: [norm]", "waits_on: [nrom]")
    text = edit(text, "{name: x8s, kind", "{name: x8, kind")
    with pytest.raises(SpecError) as excinfo:
        parse_spec(text, "bad.yaml")
    lines = [i.line for i in excinfo.value.issues]
    assert lines == [line_of(text, "{name: x8, kind: pairs"), line_of(text, "waits_on: [nrom]")]
