"""Lowering of the real spec for every target and a range of token counts, and
the builds it must refuse with a located error (spec edits) or a ValueError
(bad build values)."""

from __future__ import annotations

import pytest

from codegen.lower import SCRATCH_ALIGN, lower, make_build
from codegen.spec import SpecError, load_spec, parse_spec
from codegen.spec.load import spec_path
from codegen.targets import TARGETS, get_target

SPEC = "minimax_m3/pre_attn"
TEXT = spec_path(SPEC).read_text()
TARGET_NAMES = ("sm90", "gfx942", "gfx950")
TOKENS = (1, 2, 3, 8, 16)
HIDDEN, QKV_ROWS, MAX_TOKENS = 6144, 2560, 16


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"edit anchor {old!r} is not unique in the spec"
    return text.replace(old, new)


def line_of(text: str, mark: str) -> int:
    hits = [n for n, line in enumerate(text.splitlines(), 1) if mark in line]
    assert len(hits) == 1, f"mark {mark!r} is on lines {hits}"
    return hits[0]


def build_ir(target: str, tokens: int, **params):
    loaded = load_spec(SPEC)
    return lower(loaded, make_build(loaded, target, tokens=tokens, **params))


# ---- the real spec ----------------------------------------------------------------------


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("target", TARGET_NAMES)
def test_lowering(target, tokens):
    ir = build_ir(target, tokens)
    t = get_target(target)
    assert ir.target is t
    assert ir.name == "minimax_m3_pre_attn"
    assert ir.threads == 512 and ir.threads % t.wave_size == 0 and ir.threads <= t.max_threads
    assert ir.blocks == (132 if target == "sm90" else 256)

    # scratch: 256-byte aligned, in spec order, non-overlapping, sized from MAX_TOKENS
    regions = ir.regions
    assert [r.name for r in regions] == ["qkv", "x8", "x8s"]
    for r in regions:
        assert r.offset % SCRATCH_ALIGN == 0, r
        assert r.nbytes > 0
    for a, b in zip(regions, regions[1:]):
        assert a.offset + a.nbytes <= b.offset, (a, b)
    assert regions[-1].offset + regions[-1].nbytes <= ir.scratch_bytes
    assert ir.scratch_bytes % SCRATCH_ALIGN == 0
    sizes = {r.name: (r.kind, r.count, r.nbytes) for r in regions}
    assert sizes["qkv"] == ("pairs", MAX_TOKENS * QKV_ROWS, 16 * 2560 * 8)
    assert sizes["x8"] == ("words", MAX_TOKENS * HIDDEN // 4, MAX_TOKENS * HIDDEN)
    assert sizes["x8s"] == ("pairs", MAX_TOKENS, MAX_TOKENS * 8)
    assert ir.arg("scratch").shape == (ir.scratch_bytes,)

    # ABI shapes follow the build
    assert ir.arg("ar").shape == (tokens, HIDDEN)
    assert ir.arg("h_out").shape == (tokens, HIDDEN)
    assert ir.arg("w_qkv").shape == (QKV_ROWS, HIDDEN)
    assert ir.arg("tl").shape == (ir.blocks, len(ir.timeline_points))
    assert ir.arg("layer").shape is None and ir.arg("layer").range == (0, 127)

    # LDS: within the target's budget; each stage's buffers 16-byte aligned, disjoint
    assert 0 < ir.lds_bytes <= t.lds_bytes
    for stage in {b.stage for b in ir.lds}:
        bufs = sorted((b for b in ir.lds if b.stage == stage), key=lambda b: b.offset)
        for b in bufs:
            assert b.offset % 16 == 0 and b.offset + b.nbytes <= ir.lds_bytes, b
        for a, b in zip(bufs, bufs[1:]):
            assert a.offset + a.nbytes <= b.offset, (a, b)
    assert not any(b.stage == "kernel" for b in ir.lds)  # timeline off by default

    # stages: the norm only above INLINE_NORM_TOKENS; the GEMV normalizes inline otherwise
    names = [s.name for s in ir.stages]
    assert names == (["norm", "qkv"] if tokens > 2 else ["qkv"])
    qkv = ir.stages[-1]
    assert qkv.kind == "gemv_fp8" and qkv.tasks == 160 == QKV_ROWS // 16
    assert qkv.values["inline"] is (tokens <= 2)
    assert qkv.values["rows"] == QKV_ROWS and qkv.values["k"] == HIDDEN
    assert qkv.waits_on == (("norm",) if tokens > 2 else ())
    tile = qkv.values["tile"]
    assert 1 <= tile <= tokens and qkv.values["n_tiles"] * tile >= tokens
    if qkv.values["inline"]:
        assert tile == tokens
    if tokens > 2:
        norm = ir.stages[0]
        assert norm.kind == "rmsnorm_fp8" and norm.tasks == tokens
        assert norm.first == (0 if target == "sm90" else 160)
    for s in ir.stages:
        assert s.first >= 0 and s.ctas > 0 and s.first + s.ctas <= ir.blocks, s
        assert s.placement == "round_robin"


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_token_tile_at_16_tokens(target):
    qkv = build_ir(target, 16).stages[-1]
    if target == "gfx942":  # 64 KiB of LDS: two passes of 8 token rows
        assert (qkv.values["tile"], qkv.values["n_tiles"]) == (8, 2)
    else:
        assert (qkv.values["tile"], qkv.values["n_tiles"]) == (16, 1)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_timeline_stamps_beside_the_union(target):
    off, on = build_ir(target, 4), build_ir(target, 4, timeline=True)
    points = len(on.timeline_points)
    assert on.lds_bytes == off.lds_bytes + points * 8
    (tl,) = [b for b in on.lds if b.stage == "kernel"]
    assert (tl.name, tl.ctype, tl.count, tl.offset) == ("tl", "u64", points, off.lds_bytes)
    assert tl.offset % 8 == 0 and tl.const_name == "LDS_TL"


def test_constants():
    ir = build_ir("gfx950", 3, timeline=True)
    consts = {c.name: c for c in ir.constants}
    assert len(consts) == len(ir.constants)
    assert consts["TOKENS"].value == 3 and consts["TIMELINE"].c_value == "true"
    assert consts["EPS"].c_type == "float" and consts["EPS"].c_value.endswith("f")
    assert consts["QKV_ROWS"].value == QKV_ROWS and consts["HIDDEN"].doc == "model hidden size"
    assert consts["BLOCKS"].value == 256 and consts["FP8_MAX"].value == 448.0
    assert consts["SCRATCH_BYTES"].value == ir.scratch_bytes
    assert {c.name: c.value for c in build_ir("gfx942", 3).constants}["FP8_MAX"] == 240.0


def test_build_key_and_defaults():
    loaded = load_spec(SPEC)
    b = make_build(loaded, "sm90")
    assert dict(b.params) == {"tokens": 1, "eps": 1e-6, "timeline": False}
    assert b.tokens == 1 and b.label() == "tokens=1 eps=1e-06 timeline=False"
    assert b.key() == make_build(loaded, "sm90", tokens=1).key()
    assert b.key() != make_build(loaded, "gfx942").key() != make_build(loaded, "sm90", tokens=2).key()
    assert isinstance(make_build(loaded, "sm90", eps=1).params[1][1], float)


# ---- refusals made by editing the spec ---------------------------------------------------

# (id, edits [(old, new)], target, tokens, mark of the line the error names, message fragment)
REFUSALS = [
    ("lds-token-tile", [("gfx942: 8}", "gfx942: 16}")], "gfx942", 16, "- name: qkv", "exceeds gfx942's 65536 B"),
    ("lds-hidden", [("HIDDEN: 6144 ", "HIDDEN: 8192 ")], "gfx942", 16, "- name: qkv", "exceeds gfx942's 65536 B"),
    ("hidden-too-wide", [("HIDDEN: 6144 ", "HIDDEN: 16384")], "gfx950", 4, "- name: norm", "32 logical warps"),
    ("threads-over-max", [("  threads: 512\n", "  threads: 2048\n")], "sm90", 1, "threads: 2048", "<= 1024"),
    ("threads-not-waves", [("  threads: 512\n", "  threads: 96\n")], "gfx950", 1, "threads: 96", "multiple of 64"),
    ("fixed-outside-grid",
     [("placement: {round_robin: {first: 160}}", "placement: {fixed: {first: 250, count: 16}}")],
     "gfx950", 3, "{fixed: {first: 250", "outside the grid of 256 CTAs"),
    ("round-robin-outside-grid-sm90",
     [("sm90: {round_robin: {first: 0}}", "sm90: {round_robin: {first: 140}}")],
     "sm90", 3, "sm90: {round_robin: {first: 140}}", "outside the grid of 132 CTAs"),
    ("fixed-ranges-overlap",
     [("placement: {round_robin: {first: 160}}", "placement: {fixed: {first: 160, count: 16}}"),
      ("    waits_on: [norm]\n", "    waits_on: [norm]\n    placement: {fixed: {first: 0, count: 170}}\n")],
     "gfx950", 3, "{fixed: {first: 0, count: 170}}", "overlap stage 'norm'"),
    ("fixed-range-too-small",
     [("    waits_on: [norm]\n", "    waits_on: [norm]\n    placement: {fixed: {first: 0, count: 100}}\n")],
     "gfx950", 3, "{fixed: {first: 0, count: 100}}", "160 tasks do not fit the fixed range of 100 CTAs"),
    ("gemv-tasks-vs-rows", [("tasks: QKV_ROWS // 16", "tasks: QKV_ROWS // 32")], "sm90", 1,
     "tasks: QKV_ROWS // 32", "80 tasks x 16 rows != rows = 2560"),
    ("inline-norm-needs-one-tile", [("INLINE_NORM_TOKENS: 2 ", "INLINE_NORM_TOKENS: 9 ")], "gfx942", 9,
     "token_tile:", "inline norm needs every token in one tile"),
    ("gemv-unknown-weight", [("weight: w_qkv", "weight: w_qk")], "sm90", 1, "weight: w_qk", "no ABI argument 'w_qk'"),
    ("gemv-out-wrong-region-kind", [("    out: qkv\n", "    out: x8\n")], "sm90", 1, "out: x8", "is words, this needs pairs"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refused_build_is_located(case):
    _, edits, target, tokens, mark, fragment = case
    text = TEXT
    for old, new in edits:
        text = edit(text, old, new)
    loaded = parse_spec(text, "bad.yaml")  # the spec itself is well-formed
    build = make_build(loaded, target, tokens=tokens)
    with pytest.raises(SpecError) as excinfo:
        lower(loaded, build)
    (issue,) = excinfo.value.issues
    expected = line_of(text, mark)
    assert issue.line == expected, str(excinfo.value)
    assert fragment in issue.message, issue.message
    assert f"[{target} {build.label()}]" in issue.message
    assert issue.hint
    head, fix = str(excinfo.value).split("\n")
    assert head.startswith(f"bad.yaml:{expected}: {'.'.join(map(str, issue.loc))}: ")
    assert fix == f"    fix: {issue.hint}"


def test_lds_refusal_only_where_over_budget():
    """token_tile 16 on gfx942 fits at 8 tokens and is refused at 16; the other
    targets take 16 token rows."""
    loaded = parse_spec(edit(TEXT, "gfx942: 8}", "gfx942: 16}"), "bad.yaml")
    assert lower(loaded, make_build(loaded, "gfx942", tokens=8)).lds_bytes <= TARGETS["gfx942"].lds_bytes
    for target in ("gfx950", "sm90"):
        lower(loaded, make_build(loaded, target, tokens=16))
    with pytest.raises(SpecError, match="LDS"):
        lower(loaded, make_build(loaded, "gfx942", tokens=16))


def test_lower_by_name_and_values():
    ir = lower(SPEC, target="gfx942", tokens=16)
    assert ir.build.target == "gfx942" and ir.stages[-1].values["tile"] == 8
    assert lower(SPEC).build.target == "sm90"


# ---- refused build values ----------------------------------------------------------------


@pytest.mark.parametrize(
    "values, pattern",
    [
        ({"tokenz": 3}, r"unknown build parameter\(s\) tokenz"),
        ({"tokens": 3, "bogus": 1, "zz": 2}, r"bogus, zz"),
        ({"tokens": "3"}, r"tokens='3' must be of type int"),
        ({"tokens": 3.0}, r"tokens=3.0 must be of type int"),
        ({"tokens": True}, r"tokens=True must be of type int"),
        ({"eps": "1e-6"}, r"eps='1e-6' must be of type float"),
        ({"timeline": 1}, r"timeline=1 must be of type bool"),
        ({"tokens": 17}, r"tokens=17 is not allowed"),
        ({"tokens": 0}, r"tokens=0 is not allowed"),
    ],
)
def test_make_build_refuses(values, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_build(load_spec(SPEC), "sm90", **values)


def test_make_build_refuses_unknown_target():
    with pytest.raises(ValueError, match="unknown target 'sm80'"):
        make_build(load_spec(SPEC), "sm80")
