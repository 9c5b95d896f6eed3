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
    """The 1-based line of ``text`` holding ``mark`` (which must be on exactly one line);
    a mark ending in a newline matches only at the end of a line (``"- name: qkv\n"``
    is the qkv stage's line, not qkv_cp's)."""
    hits = [n for n, line in enumerate(text.splitlines(), 1) if mark in line + "\n"]
    assert len(hits) == 1, f"mark {mark!r} is on lines {hits}"
    return hits[0]


# unique edit anchors in the qkv stage (the qkv_cp stage repeats its fields)
QKV_TASKS = "    tasks: (QKV_HEADS + 2) * HEAD_DIM // 16\n"
QKV_WAITS = QKV_TASKS + "    waits_on: [norm]\n"


# ---- the valid spec ------------------------------------------------------------------


def test_valid_spec_loads():
    loaded = load_spec(SPEC)
    spec = loaded.spec
    assert spec.kernel == SPEC
    assert spec.c_name == "minimax_m3_pre_attn"
    assert [s.name for s in spec.stages] == ["norm", "qkv", "qkv_cp", "heads", "scores"]
    assert [s.kind for s in spec.stages] == ["rmsnorm_fp8", "gemv_fp8", "gemv_fp8", "head_norm_rope", "index_scores"]
    assert [s.waits_on for s in spec.stages] == [[], ["norm"], ["norm", "qkv"], ["qkv"], ["qkv_cp", "heads"]]
    assert [s.when for s in spec.stages] == ["tokens > INLINE_NORM_TOKENS", None, "index_heads > 1", None, None]
    stages = {s.name: s for s in spec.stages}
    assert stages["qkv_cp"].long_step is not None and stages["qkv"].long_step is None
    assert len(stages["qkv_cp"].row_ranges) == 3 and len(stages["qkv"].row_ranges) == 3
    assert stages["qkv_cp"].writes_residual is False and stages["qkv"].writes_residual is True
    assert stages["qkv_cp"].norm_inline is False and stages["qkv"].norm_inline is True
    # stream-K on sm90 only, its partial tiles in qkv_part
    assert [stages["qkv"].stream_k.for_target(t) for t in ("sm90", "gfx942", "gfx950")] == [1, 0, 0]
    assert stages["qkv"].partials == "qkv_part" and stages["qkv_cp"].partials is None
    assert stages["qkv_cp"].stream_k.for_target("sm90") == 0
    assert stages["heads"].done == "hdone" and stages["heads"].iq_pairs == "iqp" and stages["scores"].iq_from == "heads"
    assert list(spec.params) == ["tokens", "eps", "timeline", "debug", "static_kv_scale", "init_blocks",
                                 "local_blocks", "index_heads", "index_own", "signal", "kv_page_stride"]
    assert spec.params["tokens"].type == "int"
    assert spec.params["tokens"].allowed() == list(range(1, 17))
    assert spec.params["index_heads"].allowed() == [1, 4] and spec.params["index_heads"].default == 1
    assert spec.params["index_own"].allowed() == [0, 1, 2, 3] and spec.params["index_own"].default == 0
    assert spec.params["debug"].default is False and spec.params["signal"].default is False
    assert spec.params["static_kv_scale"].type == "bool" and spec.params["static_kv_scale"].default is False
    assert spec.params["kv_page_stride"].allowed() == [8, 16] and spec.params["kv_page_stride"].default == 16
    assert spec.grid.threads == 512
    assert {a.name for a in spec.abi} >= {"scratch", "step", "layer"}
    assert len(spec.abi) == 29 and spec.abi[-1].name == "tl"
    assert set(spec.runtime_dims) == {"max_pos", "k_pages", "v_pages", "scale_pages", "num_blocks", "bt_cols"}
    abi = {a.name: a for a in spec.abi}
    assert abi["cos_sin"].shape == ["max_pos", "ROTARY_DIM"]
    assert abi["index_cache"].shape == ["num_blocks", "SPARSE_BLOCK", "HEAD_DIM"]
    assert (spec.mailbox.counter, spec.mailbox.layer, spec.mailbox.tag_stride) == ("step", "layer", "LAYER_SLOTS")
    assert spec.timeline_points == ["start", "sums_reduced", "x8_ready", "gemv_done", "head_got_qkv",
                                    "pre_attn_done", "scores_done", "spare"]
    # 'hang' is not in the spec: debug builds add it
    assert [r.name for r in spec.scratch] == ["qkv", "qkv_part", "x8", "x8s", "rdone", "hdone", "iqp"]
    assert [r.kind for r in spec.scratch] == ["pairs", "pairs", "words", "pairs", "flags", "flags", "pairs"]
    assert loaded.text == TEXT


def test_valid_spec_positions_and_comments():
    loaded = load_spec(SPEC)
    assert loaded.positions.line_of(("grid", "threads")) == line_of(TEXT, "  threads: 512")
    assert loaded.positions.line_of(("stages", 1, "tasks")) == line_of(TEXT, QKV_TASKS)
    assert loaded.positions.line_of(("stages", 1, "waits_on", 0)) == line_of(TEXT, QKV_TASKS) + 1
    assert TEXT.splitlines()[line_of(TEXT, QKV_TASKS)] == "    waits_on: [norm]"
    # an unknown child falls back to its nearest located ancestor
    assert loaded.positions.line_of(("stages", 1, "nope", 3)) == line_of(TEXT, "- name: qkv\n")
    assert loaded.positions.line_of(("stages", 2)) == line_of(TEXT, "- name: qkv_cp\n")
    assert loaded.positions.line_of(("stages", 2, "tasks")) == line_of(TEXT, "tasks: 3 * HEAD_DIM // 16")
    assert loaded.positions.line_of(("stages", 2, "long_step")) == line_of(TEXT, "long_step: {}")
    assert loaded.positions.line_of(("stages", 2, "waits_on", 1)) == line_of(TEXT, "waits_on: [norm, qkv]")
    assert loaded.positions.line_of(("stages", 1, "stream_k")) == line_of(TEXT, "stream_k: {default: 0, sm90: 1}")
    assert loaded.positions.line_of(("stages", 3, "tasks")) == line_of(TEXT, "tasks: N_HEAD_TASKS")
    assert loaded.positions.line_of(("stages", 4, "waits_on", 1)) == line_of(TEXT, "waits_on: [qkv_cp, heads]")
    assert loaded.positions.line_of(("runtime_dims", "max_pos")) == line_of(TEXT, "max_pos: rows of")
    assert loaded.positions.line_of(("mailbox", "counter")) == line_of(TEXT, "counter: step")
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
    ("unknown-stage-kind", ("  - name: qkv\n    kind: gemv_fp8\n", "  - name: qkv\n    kind: gemv_fp16\n"),
     "kind: gemv_fp16", "'gemv_fp16'"),
    ("stage-without-kind", ("  - name: qkv\n    kind: gemv_fp8\n", "  - name: qkv\n"), "- name: qkv\n", "'kind'"),
    ("unknown-symbol", (QKV_TASKS, "    tasks: (QKV_HEAD + 2) * HEAD_DIM // 16\n"), "(QKV_HEAD + 2)",
     "unknown symbol 'QKV_HEAD'"),
    ("unknown-symbol-in-symbols", ("3 + index_heads) * HEAD_DIM ", "3 + index_heads) * HEAD_DIMS "), "QKV_ROWS:",
     "unknown symbol 'HEAD_DIMS'"),
    ("unparsable-expression", (QKV_TASKS, "    tasks: (QKV_HEADS + 2) * HEAD_DIM //\n"), "HEAD_DIM //\n",
     "cannot parse expression"),
    ("unparsable-symbol", ("  HEAD_DIM: 128\n", "  HEAD_DIM: 128 +* 2\n"), "HEAD_DIM: 128 +* 2", "cannot parse expression"),
    # Python parses "2and x" as 2 and x, with a warning: a typo in a spec
    ("number-glued-to-word", ("  HEAD_DIM: 128\n", "  HEAD_DIM: 128and 2\n"), "HEAD_DIM: 128and 2",
     "cannot parse expression '128and 2': invalid decimal literal"),
    ("unsupported-name-call", (QKV_TASKS, "    tasks: abs(QKV_HEADS + 2) * HEAD_DIM // 16\n"), "abs(QKV_HEADS + 2)",
     "unknown symbol 'abs'"),
    ("default-outside-values", ("    values: 1..16\n    default: 1\n", "    values: 1..16\n    default: 99\n"), "default: 99", "not among values"),
    ("default-wrong-type", ("    default: false\n    doc: stamp", "    default: 4\n    doc: stamp"), "default: 4", "not of type bool"),
    ("bad-range", ("values: 1..16", "values: 16..1"), "values: 16..1", "'16..1' is empty"),
    ("malformed-range", ("values: 1..16", "values: 1-16"), "values: 1-16", "must look like 'lo..hi'"),
    ("abi-name-twice", ("{name: res, dtype", "{name: ar, dtype"), "{name: ar, dtype: bf16, shape: [tokens, HIDDEN], doc: residual in}", "ABI name 'ar' used twice"),
    ("abi-bad-dtype", ("{name: s_qkv, dtype: f32", "{name: s_qkv, dtype: f16"), "dtype: f16", "'bf16'"),
    ("param-shadows-symbol", ("  eps:\n", "  HIDDEN:   # clash\n    type: int\n    default: 1\n  eps:\n"), "# clash",
     "parameter 'HIDDEN' becomes the C constant HIDDEN, which a symbol already names"),
    ("param-upper-case-clashes-symbol", ("  eps:\n", "  hidden:   # clash\n    type: int\n    default: 1\n  eps:\n"), "# clash",
     "parameter 'hidden' becomes the C constant HIDDEN, which a symbol already names"),
    ("scratch-region-twice", ("{name: x8s, kind", "{name: x8, kind"), "{name: x8, kind: pairs", "scratch region 'x8' defined twice"),
    ("stage-name-twice", ("  - name: qkv\n", "  - name: norm   # again\n"), "# again", "stage name 'norm' used twice"),
    ("waits-on-itself", (QKV_WAITS, QKV_TASKS + "    waits_on: [qkv]   # itself\n"), "# itself", "waits on itself"),
    ("cp-waits-on-itself", ("    waits_on: [norm, qkv]  ", "    waits_on: [norm, qkv, qkv_cp]  "), "waits_on: [norm, qkv, qkv_cp]",
     "stage 'qkv_cp' waits on itself"),
    ("cp-waits-on-later-heads", ("    waits_on: [norm, qkv]  ", "    waits_on: [norm, heads]  "), "waits_on: [norm, heads]",
     "stage 'qkv_cp' waits on later stage 'heads'"),
    ("stream-k-bad-target", ("stream_k: {default: 0, sm90: 1}", "stream_k: {default: 0, sm80: 1}"), "sm80: 1}",
     "Extra inputs are not permitted"),
    ("waits-on-later", ("    kind: rmsnorm_fp8\n", "    kind: rmsnorm_fp8\n    waits_on: [qkv]   # later\n"), "# later", "waits on later stage 'qkv'"),
    ("waits-on-unknown", (QKV_WAITS, QKV_TASKS + "    waits_on: [nrom]\n"), "waits_on: [nrom]", "waits on unknown stage 'nrom'"),
    ("missing-tokens-param", ("  tokens:\n    type: int", "  ntokens:\n    type: int"), "params:", "must define 'tokens'"),
    ("tokens-param-not-int", ("  tokens:\n    type: int\n    values: 1..16\n    default: 1\n", "  tokens:\n    type: float\n    default: 1.0\n"), "params:", "must define 'tokens'"),
    ("missing-timeline-start", ("timeline_points: [start, ", "timeline_points: ["), "timeline_points:", "timeline point 'start' is missing"),
    ("timeline-point-twice", ("head_got_qkv, pre_attn_done, scores_done, spare]", "head_got_qkv, pre_attn_done, gemv_done, scores_done, spare]"),
     "timeline_points:", "listed twice"),
    ("review-build-unknown-param", ("  - {tokens: 4}\n", "  - {tokenz: 4}\n"), "{tokenz: 4}", "unknown build parameter 'tokenz'"),
    ("review-build-value-not-allowed", ("  - {tokens: 4}\n", "  - {tokens: 40}\n"), "{tokens: 40}", "40 not allowed"),
    ("bad-kernel-name", ("kernel: minimax_m3/pre_attn", "kernel: MiniMax/pre-attn"), "kernel: MiniMax", "should match pattern"),
    ("waits-on-later-heads", (QKV_WAITS, QKV_TASKS + "    waits_on: [norm, heads]\n"), "waits_on: [norm, heads]",
     "stage 'qkv' waits on later stage 'heads'"),
    ("heads-waits-on-later-scores", ("    waits_on: [qkv]  # the heads' rows\n", "    waits_on: [qkv, scores]\n"),
     "waits_on: [qkv, scores]", "stage 'heads' waits on later stage 'scores'"),
    ("scores-waits-on-unknown", ("waits_on: [qkv_cp, heads]", "waits_on: [qkv_cpp, heads]"), "waits_on: [qkv_cpp, heads]",
     "stage 'scores' waits on unknown stage 'qkv_cpp'"),
    ("cp-unknown-symbol-in-when", ("when: index_heads > 1", "when: index_head > 1"), "when: index_head > 1",
     "unknown symbol 'index_head'"),
    ("index-heads-default-not-allowed", ("    values: [1, 4]\n    default: 1\n", "    values: [1, 4]\n    default: 2\n"),
     "default: 2\n", "not among values"),
    ("review-build-index-own-not-allowed", ("  - {tokens: 4}\n", "  - {tokens: 4, index_own: 4}\n"),
     "index_own: 4}", "4 not allowed"),
    ("heads-unknown-symbol", ("tasks: N_HEAD_TASKS", "tasks: N_HEAD_TASK"), "tasks: N_HEAD_TASK", "unknown symbol 'N_HEAD_TASK'"),
    ("unknown-symbol-in-placement", ("sm90: {round_robin: {first: 112}}", "sm90: {round_robin: {first: GEMV_CTAS}}"),
     "{first: GEMV_CTAS}", "unknown symbol 'GEMV_CTAS'"),
    ("kv-page-stride-default-not-allowed", ("    default: 16\n", "    default: 12\n"), "default: 12", "not among values"),
    ("review-build-page-stride-not-allowed", ("  - {tokens: 4}\n", "  - {tokens: 4, kv_page_stride: 4}\n"),
     "kv_page_stride: 4}", "4 not allowed"),
    ("review-build-static-scale-wrong-type", ("  - {tokens: 4}\n", "  - {tokens: 4, static_kv_scale: 1}\n"),
     "static_kv_scale: 1}", "static_kv_scale=1 is not of type bool"),
    # runtime dimensions: bare names bound at launch, never a second meaning of a symbol or parameter
    ("runtime-dim-shadows-symbol", ("  bt_cols: columns of the block table\n",
                                    "  bt_cols: columns of the block table\n  HEAD_DIM: clash   # shadow\n"),
     "# shadow", "runtime dimension 'HEAD_DIM' shadows a symbol or parameter"),
    ("runtime-dim-shadows-param", ("  bt_cols: columns of the block table\n",
                                   "  bt_cols: columns of the block table\n  tokens: clash   # shadow\n"),
     "# shadow", "runtime dimension 'tokens' shadows a symbol or parameter"),
    ("abi-shape-undeclared-name", ("shape: [max_pos, ROTARY_DIM]", "shape: [max_rows, ROTARY_DIM]"),
     "[max_rows, ROTARY_DIM]", "unknown symbol 'max_rows'"),
    ("abi-shape-runtime-dim-in-expression", ("shape: [k_pages, PAGE_BYTES]", "shape: [k_pages * 2, PAGE_BYTES]"),
     "[k_pages * 2, PAGE_BYTES]", "unknown symbol 'k_pages'"),
    # may_alias: other tensor arguments only
    ("may-alias-unknown", ("may_alias: [v_cache]", "may_alias: [v_cachee]"), "may_alias: [v_cachee]",
     "'k_cache' may alias 'v_cachee': that is no ABI argument"),
    ("may-alias-itself", ("may_alias: [v_cache]", "may_alias: [k_cache]"), "may_alias: [k_cache]",
     "'k_cache' may alias 'k_cache': that is itself"),
    ("may-alias-on-a-scalar", ("{name: q_len, dtype: i32,", "{name: q_len, dtype: i32, may_alias: [k_cache],"),
     "{name: q_len", "'may_alias' applies to tensors only"),
    ("may-alias-scalar", ("may_alias: [v_cache]", "may_alias: [q_len]"), "may_alias: [q_len]",
     "'k_cache' may alias 'q_len': that is a scalar"),
    # the mailbox counter: an i32 [2] inout argument, refused at mailbox.counter
    ("mailbox-counter-not-pair", ("  counter: step ", "  counter: seq_lens "), "counter: seq_lens",
     "the counter must name an i32 [2] inout ABI argument, got 'seq_lens'"),
    ("mailbox-counter-wrong-shape", ("{name: step, dtype: i32, shape: [2]", "{name: step, dtype: i32, shape: [4]"),
     "counter: step", "the counter must name an i32 [2] inout ABI argument, got 'step'"),
    ("mailbox-counter-unknown", ("  counter: step ", "  counter: stepz "), "counter: stepz",
     "the counter must name an i32 [2] inout ABI argument, got 'stepz'"),
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
                   "waits-on-later", "waits-on-unknown", "missing-timeline-start", "review-build-unknown-param",
                   "runtime-dim-shadows-symbol", "runtime-dim-shadows-param", "abi-shape-undeclared-name",
                   "mailbox-counter-not-pair", "mailbox-counter-wrong-shape"}
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
    text = edit(TEXT, QKV_WAITS, QKV_TASKS + "    waits_on: [nrom]\n")
    text = edit(text, "{name: x8s, kind", "{name: x8, kind")
    with pytest.raises(SpecError) as excinfo:
        parse_spec(text, "bad.yaml")
    lines = [i.line for i in excinfo.value.issues]
    assert lines == [line_of(text, "{name: x8, kind: pairs"), line_of(text, "waits_on: [nrom]")]


@pytest.mark.parametrize("case_id, loc", [
    ("runtime-dim-shadows-symbol", ("runtime_dims", "HEAD_DIM")),
    ("runtime-dim-shadows-param", ("runtime_dims", "tokens")),
    ("abi-shape-undeclared-name", ("abi", 10, "shape", 0)),
    ("abi-shape-runtime-dim-in-expression", ("abi", 13, "shape", 0)),
    ("mailbox-counter-not-pair", ("mailbox", "counter")),
    ("mailbox-counter-wrong-shape", ("mailbox", "counter")),
    ("mailbox-counter-unknown", ("mailbox", "counter")),
])
def test_new_sections_locate_their_field(case_id, loc):
    """Runtime dimensions, runtime-shaped ABI arguments and the mailbox counter are
    refused at the field itself, the only issue of the edit."""
    (case,) = [c for c in CASES if c[0] == case_id]
    with pytest.raises(SpecError) as excinfo:
        parse_spec(_mutated(case), "bad.yaml")
    assert [i.loc for i in excinfo.value.issues] == [loc], str(excinfo.value)


def test_runtime_dims_are_bare_names_only_in_shapes():
    """A runtime dimension stands for itself in an ABI shape; elsewhere (a symbol,
    a stage's tasks) it is an unknown name like any other."""
    text = edit(TEXT, "  N_HEAD_TASKS: LOCAL_Q_HEADS + 4 ", "  N_HEAD_TASKS: max_pos + 4 ")
    with pytest.raises(SpecError) as excinfo:
        parse_spec(text, "bad.yaml")
    (issue,) = excinfo.value.issues
    assert issue.loc == ("symbols", "N_HEAD_TASKS") and "unknown symbol 'max_pos'" in issue.message
    assert issue.line == line_of(text, "N_HEAD_TASKS: max_pos + 4")


def test_param_named_like_a_symbol_reports_both_clashes():
    """A parameter spelled like a symbol is refused twice at its own line: as the C
    constant it would become, then as a second meaning of the name."""
    (case,) = [c for c in CASES if c[0] == "param-shadows-symbol"]
    text = _mutated(case)
    with pytest.raises(SpecError) as excinfo:
        parse_spec(text, "bad.yaml")
    issues = excinfo.value.issues
    assert [i.loc for i in issues] == [("params", "HIDDEN"), ("params", "HIDDEN")]
    assert {i.line for i in issues} == {line_of(text, "# clash")}
    assert "becomes the C constant HIDDEN" in issues[0].message
    assert "'HIDDEN' is both a symbol and a parameter" in issues[1].message


def test_only_the_start_point_is_required():
    """The kernel stamps 'start' itself; every other timeline point is the spec's
    choice (the scores stage names the two it stamps)."""
    text = edit(TEXT, "timeline_points: [start, sums_reduced, x8_ready, gemv_done, head_got_qkv, pre_attn_done, scores_done, spare]",
                "timeline_points: [start, pre_attn_done, scores_done]")
    assert parse_spec(text, "good.yaml").spec.timeline_points == ["start", "pre_attn_done", "scores_done"]
    text = edit(TEXT, "timeline_points: [start, sums_reduced,", "timeline_points: [sums_reduced,")
    with pytest.raises(SpecError, match="timeline point 'start' is missing"):
        parse_spec(text, "bad.yaml")
