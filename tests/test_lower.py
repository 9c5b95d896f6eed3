"""Lowering of the real spec for every target and a range of token counts, and
the builds it must refuse with a located error (spec edits) or a ValueError
(bad build values)."""

from __future__ import annotations

import pytest

from codegen.lower import SCRATCH_ALIGN, lower, make_build
from codegen.spec import SpecError, load_spec, parse_spec, tune_items
from codegen.spec.load import spec_path
from codegen.targets import TARGETS, get_target
from tests.minimax_case import CUDA_CORES

SPEC = "minimax_m3/pre_attn"
TEXT = spec_path(SPEC).read_text()
TARGET_NAMES = ("sm90", "gfx942", "gfx950")
TOKENS = (1, 2, 3, 8, 16)
HIDDEN, QKV_ROWS, MAX_TOKENS = 6144, 2560, 16
HEAD_DIM, ROTARY_DIM, LOCAL_Q_HEADS = 128, 64, 16
REGIONS = ["qkv", "qkv_part", "x8", "x8s", "rdone", "hdone", "iqp"]  # the spec's; debug builds add "hang"
# unique edit anchors in the qkv stage (the qkv_cp stage repeats most of its fields)
QKV_TASKS = "    tasks: (QKV_HEADS + 2) * HEAD_DIM // 16\n"
QKV_WAITS = QKV_TASKS + "    waits_on: [norm]\n"
QKV_TILE = "token_tile: {default: 16, gfx942: 8}     # gfx942 has 64 KiB of LDS"


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"edit anchor {old!r} is not unique in the spec"
    return text.replace(old, new)


def line_of(text: str, mark: str) -> int:
    """The line holding ``mark``; a mark ending in a newline matches only at a line's end."""
    hits = [n for n, line in enumerate(text.splitlines(), 1) if mark in line + "\n"]
    assert len(hits) == 1, f"mark {mark!r} is on lines {hits}"
    return hits[0]


def build_ir(target: str, tokens: int, **params):
    loaded = load_spec(SPEC)
    return lower(loaded, make_build(loaded, target, tokens=tokens, **params))


def stage_named(ir, name: str):
    """The lowered stage ``name`` (stages are found by name: which run depends on the build)."""
    (s,) = [s for s in ir.stages if s.name == name]
    return s


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
    assert [r.name for r in regions] == REGIONS
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
    assert sizes["qkv_part"] == ("pairs", QKV_ROWS * MAX_TOKENS, QKV_ROWS * MAX_TOKENS * 8)
    assert sizes["rdone"] == ("flags", MAX_TOKENS, MAX_TOKENS * 8)
    assert sizes["hdone"] == ("flags", MAX_TOKENS * 20, MAX_TOKENS * 20 * 8)
    assert sizes["iqp"] == ("pairs", MAX_TOKENS * 64, MAX_TOKENS * 64 * 8)
    assert ir.arg("scratch").shape == (ir.scratch_bytes,)

    # ABI shapes follow the build
    assert ir.arg("ar").shape == (tokens, HIDDEN)
    assert ir.arg("h_out").shape == (tokens, HIDDEN)
    assert ir.arg("w_qkv").shape == (QKV_ROWS, HIDDEN)
    assert ir.arg("tl").shape == (ir.blocks, len(ir.timeline_points))
    assert ir.arg("layer").shape is None and ir.arg("layer").range == (0, 127)
    assert len(ir.abi) == 29 and [a.name for a in ir.abi][-4:] == ["scratch", "step", "layer", "tl"]
    # runtime dimensions stay names (bound at launch); the rest evaluate for the build
    assert ir.arg("cos_sin").shape == ("max_pos", ROTARY_DIM)
    assert ir.arg("k_cache").shape == ("k_pages", 2048) and ir.arg("v_cache").shape == ("v_pages", 2048)
    assert ir.arg("k_scale").shape == ("scale_pages", 16) == ir.arg("v_scale").shape
    assert ir.arg("index_cache").shape == ("num_blocks", 128, HEAD_DIM)
    assert ir.arg("block_table").shape == (tokens, "bt_cols")
    assert ir.arg("q_out").shape == (tokens, LOCAL_Q_HEADS * HEAD_DIM)
    assert ir.arg("iq_out").shape == (tokens, 1, HEAD_DIM)
    assert ir.arg("iscore").shape == (MAX_TOKENS * 8192 * 8,)
    assert ir.arg("positions").dtype == "i64" and ir.arg("positions").shape == (tokens,)
    assert ir.arg("bt_width").shape is None and ir.arg("bt_width").range == (1, 8192)
    assert ir.arg("cos_sin").shape_text == f"[max_pos, {ROTARY_DIM}]"
    assert ir.arg("ar").shape_text == f"[{tokens}, {HIDDEN}]" and ir.arg("layer").shape_text == "scalar"
    for a in ir.abi:
        assert all(isinstance(d, int) or d in load_spec(SPEC).spec.runtime_dims for d in a.shape or ()), a

    # LDS: within the target's budget; each stage's buffers 16-byte aligned, disjoint
    assert 0 < ir.lds_bytes <= t.lds_bytes
    for stage in {b.stage for b in ir.lds}:
        bufs = sorted((b for b in ir.lds if b.stage == stage), key=lambda b: b.offset)
        for b in bufs:
            assert b.offset % 16 == 0 and b.offset + b.nbytes <= ir.lds_bytes, b
        for a, b in zip(bufs, bufs[1:]):
            assert a.offset + a.nbytes <= b.offset, (a, b)
    assert not any(b.stage == "kernel" for b in ir.lds)  # timeline off by default

    # stages: the norm only above INLINE_NORM_TOKENS; the GEMV normalizes inline otherwise;
    # qkv_cp only with four index heads (not in the default build)
    names = [s.name for s in ir.stages]
    assert names == (["norm"] if tokens > 2 else []) + ["qkv", "heads", "scores"]
    qkv, heads, scores = stage_named(ir, "qkv"), stage_named(ir, "heads"), stage_named(ir, "scores")
    assert ir.stages[-2:] == (heads, scores)  # the head tasks, then the scorers, run last
    assert scores.kind == "index_scores" and scores.tasks == ir.blocks and (scores.first, scores.ctas) == (0, ir.blocks)
    assert scores.waits_on == ("heads",)  # qkv_cp is not in the build: its wait is dropped
    sv = scores.values
    assert sv["lead"] == ((28 if tokens <= 2 else 0) if target == "sm90" else 180) and sv["done"] == "hdone"
    # sm90: the late ranks (up to 2 rows CTAs 0..27 and the head CTAs, above only the head CTAs)
    # take the first rounds' items off; AMD deals plain rounds
    late = ((48, 4) if tokens <= 2 else (20, 6)) if target == "sm90" else (0, 0)
    assert (sv["late_ctas"], sv["late_items"]) == late
    # sm90 above 2 rows: up to 24 items a CTA (run time) lead 28 with 48 late ranks, 6 items fewer
    few = (24, 28, 48, 6) if target == "sm90" and tokens > 2 else (0, 0, 0, 0)
    assert (sv["few_items"], sv["few_lead"], sv["few_late_ctas"], sv["few_late_items"]) == few
    assert (sv["start_point"], sv["done_point"]) == ("pre_attn_done", "scores_done")
    assert (sv["heads"], sv["own"], sv["iq_base"], sv["qkv_rows"]) == (1, 0, 2304, QKV_ROWS)
    assert (sv["head_dim"], sv["rotary_dim"], sv["lanes"], sv["elems"]) == (HEAD_DIM, ROTARY_DIM, 32, 4)
    assert (sv["topk_blocks"], sv["init_blocks"], sv["local_blocks"], sv["stride"]) == (16, 0, 1, 8192)
    assert heads.kind == "head_norm_rope" and heads.tasks == LOCAL_Q_HEADS + 4 == 20 and heads.waits_on == ("qkv",)
    assert heads.first == (112 if target == "sm90" else 160) and heads.first + heads.ctas == ir.blocks
    hv = heads.values
    assert (hv["rows"], hv["q_heads"], hv["head_dim"], hv["rotary_dim"]) == (QKV_ROWS, LOCAL_Q_HEADS, HEAD_DIM, ROTARY_DIM)
    assert hv["offsets"] == {"k": 2048, "v": 2176, "iq": 2304, "ik": 2432}
    assert (hv["page_stride"], hv["static_kv_scale"]) == (16, False)  # the build's defaults
    assert qkv.kind == "gemv_fp8" and qkv.tasks == 160 == QKV_ROWS // 16
    assert qkv.values["inline"] is (tokens <= 2)
    # q | k | v, the own index q, index k; sm90 up to 2 rows: the own index q's rows first, outside
    # stream-K (rows_first, measured faster: MiniMax session 38)
    rows_first = target == "sm90" and tokens <= 2
    assert qkv.values["ranges"] == [(0, 144)] + [(144, 8)] * (not rows_first) + [(152, 8)]
    assert qkv.values["rows_first"] == ((2304, 128) if rows_first else None)
    # stream-K on sm90 only (160 row groups over 132 SMs), partial tiles through qkv_part
    if target == "sm90":
        assert qkv.values["split"] is True and qkv.values["partials"] == "qkv_part"
        assert (qkv.values["tasks"], qkv.values["ctas"], qkv.values["nchunk"]) == (160 - 8 * rows_first, 132, HIDDEN // 32)
    else:
        assert qkv.values["split"] is False and qkv.values["partials"] is None
    assert qkv.values["rows"] == QKV_ROWS and qkv.values["k"] == HIDDEN
    assert qkv.waits_on == (("norm",) if tokens > 2 else ())
    tile = qkv.values["tile"]
    assert 1 <= tile <= tokens and qkv.values["n_tiles"] * tile >= tokens
    if qkv.values["inline"]:
        assert tile == tokens
    if tokens > 2:
        norm = stage_named(ir, "norm")
        assert ir.stages[0] is norm
        assert norm.kind == "rmsnorm_fp8" and norm.tasks == tokens
        assert norm.first == (0 if target == "sm90" else 160)
    for s in ir.stages:
        assert s.first >= 0 and s.ctas > 0 and s.first + s.ctas <= ir.blocks, s
        assert s.placement == "round_robin"


@pytest.mark.parametrize("own", range(4))
@pytest.mark.parametrize("tokens", (1, 4))
@pytest.mark.parametrize("target", TARGET_NAMES)
def test_context_parallel_build(target, tokens, own):
    """index_heads 4: the projection holds four index-q heads; qkv computes the own one,
    qkv_cp the other three (only in steps with a long request), and between them every
    row group is computed exactly once; the scorers wait on both."""
    ir = build_ir(target, tokens, index_heads=4, index_own=own)
    rows = (LOCAL_Q_HEADS + 3 + 4) * HEAD_DIM  # 2944
    assert [s.name for s in ir.stages] == (["norm"] if tokens > 2 else []) + ["qkv", "qkv_cp", "heads", "scores"]
    qkv, cp = stage_named(ir, "qkv"), stage_named(ir, "qkv_cp")
    heads, scores = stage_named(ir, "heads"), stage_named(ir, "scores")
    assert ir.arg("w_qkv").shape == (rows, HIDDEN) and qkv.values["rows"] == cp.values["rows"] == rows
    assert cp.kind == "gemv_fp8" and cp.tasks == 24 and cp.values["long_step"] == {
        "seq_lens": "seq_lens", "q_len": "q_len", "from_blocks": 288, "block": 128}
    assert qkv.values["long_step"] is None
    assert cp.first == (40 if target == "sm90" else 196) and cp.first + cp.ctas == ir.blocks
    assert cp.waits_on == (("norm", "qkv") if tokens > 2 else ("qkv",))
    assert cp.values["inline"] is False and cp.values["writes_residual"] is False  # it never renormalizes
    assert cp.values["split"] is False  # stream-K is qkv's alone
    own_group = (LOCAL_Q_HEADS + 2 + own) * HEAD_DIM // 16
    assert qkv.values["ranges"] == [(0, 144), (own_group, 8), (2816 // 16, 8)]
    others = [(LOCAL_Q_HEADS + 2 + h) * HEAD_DIM // 16 for h in range(4) if h != own]
    assert cp.values["ranges"] == [(g, 8) for g in others]
    groups = [g for first, n in qkv.values["ranges"] + cp.values["ranges"] for g in range(first, first + n)]
    assert sorted(groups) == list(range(rows // 16))  # every row group once
    assert heads.values["offsets"] == {"k": 2048, "v": 2176, "iq": 2304 + own * HEAD_DIM, "ik": 2816}
    assert scores.waits_on == ("qkv_cp", "heads")
    assert (scores.values["heads"], scores.values["own"], scores.values["iq_base"]) == (4, own, 2304)
    assert ir.region("qkv").count == MAX_TOKENS * rows


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_debug_build_adds_the_hang_region(target):
    """Debug builds append the hang record after the spec's regions; nothing else moves."""
    base, debug = build_ir(target, 4), build_ir(target, 4, debug=True)
    assert [r.name for r in debug.regions] == REGIONS + ["hang"]
    assert debug.regions[:-1] == base.regions
    hang = debug.region("hang")
    assert (hang.kind, hang.count) == ("words", 8) and hang.offset % SCRATCH_ALIGN == 0
    assert hang.offset >= base.regions[-1].offset + base.regions[-1].nbytes
    assert debug.scratch_bytes >= hang.offset + hang.nbytes and debug.scratch_bytes > base.scratch_bytes
    assert [(s.name, s.first, s.ctas, s.tasks) for s in debug.stages] == [(s.name, s.first, s.ctas, s.tasks) for s in base.stages]


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_token_tile_at_16_tokens(target):
    qkv = stage_named(build_ir(target, 16), "qkv")
    if target == "gfx942":  # 64 KiB of LDS: two passes of 8 token rows
        assert (qkv.values["tile"], qkv.values["n_tiles"]) == (8, 2)
    else:
        assert (qkv.values["tile"], qkv.values["n_tiles"]) == (16, 1)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_timeline_stamps_beside_the_union(target):
    """The stamps, then 3 slots (the CTA's timer at its start and end, its cycles at the end:
    sm90 stamps cycles, turned into timer ticks at the end), beside the stages' union."""
    off, on = build_ir(target, 4), build_ir(target, 4, timeline=True)
    slots = len(on.timeline_points) + 3
    assert on.lds_bytes == off.lds_bytes + slots * 8
    (tl,) = [b for b in on.lds if b.stage == "kernel"]
    assert (tl.name, tl.ctype, tl.count, tl.offset) == ("tl", "u64", slots, off.lds_bytes)
    assert tl.offset % 8 == 0 and tl.const_name == "LDS_TL"


def test_timeline_stamps_cycles_between_two_timer_reads(tmp_path):
    """sm90 timeline builds stamp the SM's cycle counter and, at the kernel's end, turn each stamp
    into timer ticks: the start's timer + its cycles since the start x the CTA's timer ticks per
    cycle (its start and end). The rendered stamp_ticks, compiled for the host (zig's clang) with
    a 1.98 GHz clock behind a timer that moves in 256 ns steps, puts a stamp 1000 cycles after
    the start 505 ns after it (to within the two timer reads' steps), leaves 0 (not reached) 0;
    AMD stamps its timer as it is."""
    import subprocess
    import sys
    from codegen.render import render

    text = render(build_ir("sm90", 1, timeline=True))
    a = text.index("constexpr int TL_T0 = 0")
    fn = text[a:text.index("\n}\n", text.index("MONO_DEVICE long long stamp_ticks", a)) + 3]
    harness = ("#include <cstdio>\n#define MONO_DEVICE inline\nconstexpr int TL_START = 0, TL_POINTS = 4;\n"
               "MONO_DEVICE constexpr bool stamp_cycles() { return true; }\n"
               "MONO_DEVICE int thread_id() { return 0; }\nMONO_DEVICE long long timer_now() { return 0; }\n"
               "MONO_DEVICE long long stamp_clock() { return 0; }\ntypedef unsigned char u8;\nconstexpr int LDS_TL = 0;\n"
               + fn + """
int main() {
    // start at cycle 5000 and timer 1,000,192 ns (a 256 ns step); end 8 us later: 15840 cycles
    long long s[7] = {5000, 0, 0, 0, 1000192, 1000192 + 8192, 5000 + 16220};
    const long long t = stamp_ticks(s, 6000), none = stamp_ticks(s, 0), first = stamp_ticks(s, 5000);
    printf("%lld %lld %lld\\n", t - 1000192, none, first - 1000192);
    return 0;
}
""")
    cpp, exe = tmp_path / "ticks.cpp", tmp_path / "ticks"
    cpp.write_text(harness)
    subprocess.run([sys.executable, "-m", "ziglang", "c++", "-O1", "-std=c++17", str(cpp), "-o", str(exe)], check=True)
    dt, none, first = (int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split())
    assert abs(dt - 505) <= 1 and none == 0 and first == 0
    assert "MONO_DEVICE constexpr bool stamp_cycles() { return false; }" in render(build_ir("gfx942", 1, timeline=True))


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_scorer_tables_and_batches(target, tokens):
    """The scorers' LDS: index q of every (token, head) (sm90's tensor-core dots: bf16 pairs,
    rows of 66 words, 8 rows more; else floats, quarters padded), two items' maxima of every
    warp (tensor cores) or two batches' per-item maxima of every wave (CUDA cores), the
    requests, the rows' context lengths, a block-table entry per thread (sm90's item_table: then
    the item itself, a word each) and, on the tensor cores up to 8 rows, each warp's ring of
    tiles_ahead + 1 tiles of 2 KB (above 8 rows the keys go to registers, key_regs); on sm90 above
    one row a word per request that marks those the CTA's items score (iq_own_requests). mma_dots, tiles_ahead and busy_waves come from the spec (sm90:
    on, 1 at S <= 2 and above 8 rows else 3, 8; else off) and a tune overrides them."""
    ir = build_ir(target, tokens)
    scores = stage_named(ir, "scores")
    own = {b.name: b for b in ir.lds if b.stage == "scores"}
    waves = ir.threads // ir.target.wave_size
    mma = target == "sm90"
    iq = ("u32", (tokens + 8) * 66) if mma else ("float", tokens * 4 * 36)
    slots = 4 if 2 < tokens <= 8 else 2  # tiles_ahead + 1
    ring = {"ring": ("u32", waves * slots * 2048 // 4)} if mma and tokens <= 8 else {}
    want = {"want": ("u32", tokens)} if mma and tokens > 1 else {}  # iq_own_requests: sm90's above one row
    assert {n: (b.ctype, b.count) for n, b in own.items()} == {
        "iq": iq, "best": ("float", 2 * tokens * waves),
        "reqs": ("u32", 5 * tokens), "seq": ("u32", tokens), "pages": ("u32", ir.threads * (2 if mma else 1)),
        **ring, **want}
    assert (scores.values["batch"], scores.values["mma"]) == (1, mma)
    if mma:
        assert (scores.values["ring"], scores.values["busy"]) == (slots, 8)
    tuned = load_spec(SPEC, tune_items({"scores.batch_items": 3, **CUDA_CORES}))
    ir = lower(tuned, make_build(tuned, target, tokens=tokens))
    assert (stage_named(ir, "scores").values["batch"], stage_named(ir, "scores").values["mma"]) == (3, False)
    own = {b.name: b.count for b in ir.lds if b.stage == "scores"}
    assert "ring" not in own and own["best"] == 2 * 3 * tokens * waves
    if mma:
        deeper = load_spec(SPEC, tune_items({"scores.tiles_ahead": 5, "scores.busy_waves": 32, "scores.key_regs": 0}))
        ir = lower(deeper, make_build(deeper, target, tokens=tokens))
        assert {b.name: b.count for b in ir.lds if b.stage == "scores"}["ring"] == waves * 6 * 2048 // 4
        assert (stage_named(ir, "scores").values["ring"], stage_named(ir, "scores").values["busy"]) == (6, 32)


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
    assert consts["STATIC_KV_SCALE"].c_value == "false" and consts["KV_PAGE_STRIDE"].value == 16
    assert (consts["K_OFF"].value, consts["IK_OFF"].value, consts["N_HEAD_TASKS"].value) == (2048, 2432, 20)
    built = {c.name: c for c in build_ir("gfx950", 3, static_kv_scale=True, kv_page_stride=8).constants}
    assert built["STATIC_KV_SCALE"].c_value == "true" and built["KV_PAGE_STRIDE"].value == 8


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_head_params_reach_the_heads_stage(target):
    """static_kv_scale and kv_page_stride are build parameters the head tasks read;
    nothing else in the lowering changes with them."""
    base = build_ir(target, 4)
    other = build_ir(target, 4, static_kv_scale=True, kv_page_stride=8)
    hv = stage_named(other, "heads").values
    assert (hv["static_kv_scale"], hv["page_stride"]) == (True, 8)
    assert stage_named(base, "heads").values["page_stride"] == 16
    assert [(s.name, s.first, s.ctas, s.tasks) for s in other.stages] == [(s.name, s.first, s.ctas, s.tasks) for s in base.stages]
    assert (other.regions, other.lds, other.abi, other.scratch_bytes) == (base.regions, base.lds, base.abi, base.scratch_bytes)


DEFAULTS = {"tokens": 1, "eps": 1e-6, "timeline": False, "debug": False, "static_kv_scale": False, "init_blocks": 0,
            "local_blocks": 1, "index_heads": 1, "index_own": 0, "signal": False, "kv_page_stride": 16}


def test_build_key_and_defaults():
    loaded = load_spec(SPEC)
    b = make_build(loaded, "sm90")
    assert dict(b.params) == DEFAULTS
    assert [name for name, _ in b.params] == list(DEFAULTS)  # spec order
    assert b.tokens == 1 and b.label() == ("tokens=1 eps=1e-06 timeline=False debug=False static_kv_scale=False "
                                           "init_blocks=0 local_blocks=1 index_heads=1 index_own=0 signal=False "
                                           "kv_page_stride=16")
    assert b.key() == make_build(loaded, "sm90", **DEFAULTS).key()
    assert len({make_build(loaded, "sm90", **{**DEFAULTS, **v}).key() for v in
                ({}, {"debug": True}, {"signal": True}, {"init_blocks": 2}, {"local_blocks": 2},
                 {"index_heads": 4}, {"index_heads": 4, "index_own": 3})}) == 7
    assert b.key() == make_build(loaded, "sm90", tokens=1).key()
    assert b.key() == make_build(loaded, "sm90", static_kv_scale=False, kv_page_stride=16).key()
    assert b.key() != make_build(loaded, "gfx942").key() != make_build(loaded, "sm90", tokens=2).key()
    keys = {make_build(loaded, "sm90", **v).key() for v in
            ({}, {"static_kv_scale": True}, {"kv_page_stride": 8}, {"static_kv_scale": True, "kv_page_stride": 8})}
    assert len(keys) == 4
    assert isinstance(dict(make_build(loaded, "sm90", eps=1).params)["eps"], float)


# ---- refusals made by editing the spec ---------------------------------------------------

# (id, edits [(old, new)], target, tokens (or the build's values), mark of the line the error
# names, message fragment)
AHEAD = 'tiles_ahead: {default: 3, sm90: "3 - 2 * (tokens <= INLINE_NORM_TOKENS or tokens > 8)"}'  # the spec's line
REFUSALS = [
    ("lds-token-tile", [(QKV_TILE, QKV_TILE.replace("gfx942: 8}", "gfx942: 16}"))], "gfx942", 16, "- name: qkv\n",
     "exceeds gfx942's 65536 B"),
    ("lds-hidden", [("HIDDEN: 6144 ", "HIDDEN: 8192 ")], "gfx942", 16, "- name: qkv\n", "exceeds gfx942's 65536 B"),
    ("hidden-too-wide", [("HIDDEN: 6144 ", "HIDDEN: 16384")], "gfx950", 4, "- name: norm", "32 logical warps"),
    ("threads-over-max", [("  threads: 512\n", "  threads: 2048\n")], "sm90", 1, "threads: 2048", "<= 1024"),
    ("threads-not-waves", [("  threads: 512\n", "  threads: 96\n")], "gfx950", 1, "threads: 96", "multiple of 64"),
    ("fixed-outside-grid",
     [("placement: {round_robin: {first: 160}}   # CTAs that", "placement: {fixed: {first: 250, count: 16}}   # CTAs that")],
     "gfx950", 3, "{fixed: {first: 250", "outside the grid of 256 CTAs"),
    ("round-robin-outside-grid-sm90",
     [("sm90: {round_robin: {first: 0}}        # fewer SMs", "sm90: {round_robin: {first: 140}}        # fewer SMs")],
     "sm90", 3, "sm90: {round_robin: {first: 140}}", "outside the grid of 132 CTAs"),
    ("fixed-ranges-overlap",
     [("placement: {round_robin: {first: 160}}   # CTAs that", "placement: {fixed: {first: 160, count: 16}}   # CTAs that"),
      (QKV_WAITS, QKV_WAITS + "    placement: {fixed: {first: 0, count: 170}}\n")],
     "gfx950", 3, "{fixed: {first: 0, count: 170}}", "overlap stage 'norm'"),
    ("fixed-range-too-small",
     [(QKV_WAITS, QKV_WAITS + "    placement: {fixed: {first: 0, count: 100}}\n")],
     "gfx950", 3, "{fixed: {first: 0, count: 100}}", "160 tasks do not fit the fixed range of 100 CTAs"),
    ("gemv-tasks-vs-rows", [(QKV_TASKS, QKV_TASKS.replace("// 16", "// 32"))], "sm90", 1,
     "HEAD_DIM // 32", "80 tasks x 16 rows != 2560 rows to compute"),
    ("inline-norm-needs-one-tile", [("INLINE_NORM_TOKENS: 2 ", "INLINE_NORM_TOKENS: 9 ")], "gfx942", 9,
     QKV_TILE, "inline norm needs every token in one tile"),
    ("gemv-unknown-weight", [(QKV_WAITS + "    weight: w_qkv\n", QKV_WAITS + "    weight: w_qk\n")], "sm90", 1,
     "weight: w_qk\n", "no ABI argument 'w_qk'"),
    ("gemv-out-wrong-region-kind", [("    out: qkv\n    " + QKV_TILE, "    out: x8\n    " + QKV_TILE)], "sm90", 1,
     "out: x8", "is words, this needs pairs"),
    ("gemv-row-range-not-whole-groups", [("      - [IQ_OFF, HEAD_DIM]\n", "      - [IQ_OFF + 8, HEAD_DIM]\n")], "gfx950", 1,
     "[IQ_OFF + 8, HEAD_DIM]", "row range [2312, 2440) is not whole 16-row groups"),
    # stream-K (sm90's qkv): one token tile, a pairs region for the partial tiles
    ("stream-k-needs-one-tile", [("stream_k: {default: 0, sm90: 1}", "stream_k: {default: 1, sm90: 1}")], "gfx942", 16,
     "stream_k: {default: 1", "stream_k needs every token in one tile (8 < 16)"),
    ("stream-k-partials-wrong-kind", [("    partials: qkv_part\n", "    partials: x8\n")], "sm90", 1,
     "partials: x8", "scratch region 'x8' is words, this needs pairs"),
    ("stream-k-partials-too-small", [("{name: qkv_part, kind: pairs, count: QKV_ROWS * MAX_TOKENS,",
                                      "{name: qkv_part, kind: pairs, count: QKV_ROWS,")], "sm90", 1,
     "partials: qkv_part", "scratch region 'qkv_part' holds 2560 pairs, this stage uses 38912"),  # 152 groups: rows_first up to 2 rows
    ("stream-k-without-partials", [("    partials: qkv_part\n", "")], "sm90", 1,
     "- name: qkv\n", "stream_k needs a pairs region for the partial tiles"),
    # the context-parallel GEMV (index_heads 4): at S <= 2 it reads the rows the qkv stage publishes
    ("cp-norm-off-needs-a-wait", [("    waits_on: [norm, qkv]  ", "    # waits_on: [norm, qkv]  ")], "gfx950",
     {"tokens": 1, "index_heads": 4}, "norm_inline: false", "with the norm stage off, this stage reads rows another stage publishes"),
    ("cp-tasks-vs-rows", [("tasks: 3 * HEAD_DIM // 16", "tasks: 2 * HEAD_DIM // 16")], "sm90", {"tokens": 4, "index_heads": 4},
     "tasks: 2 * HEAD_DIM // 16", "16 tasks x 16 rows != 384 rows to compute"),
    ("cp-outside-grid-sm90", [("sm90: {round_robin: {first: 40}}", "sm90: {round_robin: {first: 132}}")], "sm90",
     {"tokens": 4, "index_heads": 4}, "{first: 132}}", "outside the grid of 132 CTAs"),
    # the scorers: they read the head stage's flags and stamp two timeline points
    ("scores-iq-from-not-heads", [("    iq_from: heads\n", "    iq_from: qkv\n")], "sm90", 1,
     "iq_from: qkv", "no head_norm_rope stage 'qkv'"),
    ("scores-must-wait-on-heads", [("waits_on: [qkv_cp, heads]", "waits_on: [qkv_cp]")], "gfx950", 3,
     "waits_on: [qkv_cp]", "the scores read 'heads''s outputs"),
    ("scores-need-head-flags", [("    done: hdone\n", "")], "sm90", 1, "iq_from: heads", "stage 'heads' publishes no done flags"),
    ("scores-unknown-timeline-point", [("start_point: pre_attn_done", "start_point: pre_attn_dome")], "gfx942", 1,
     "start_point: pre_attn_dome", "no timeline point 'pre_attn_dome'"),
    ("scores-batch-too-large", [("    " + AHEAD + "\n", "    batch_items: {default: 5, sm90: 1}\n    " + AHEAD + "\n")],
     "gfx950", 4, "batch_items: {default: 5, sm90: 1}", "batches of 5 keep 80 key registers a thread, more than the 64"),
    ("scores-mma-on-amd", [("mma_dots: {default: 0, sm90: 1}", "mma_dots: {default: 1, sm90: 1}")], "gfx942", 1,
     "mma_dots: {default: 1, sm90: 1}", "gfx942's device library has no bf16 m16n8k16 MMA"),
    ("scores-mma-batch", [("    " + AHEAD + "\n", "    batch_items: {default: 1, sm90: 2}\n    " + AHEAD + "\n")], "sm90", 1,
     "batch_items: {default: 1, sm90: 2}", "the tensor-core dots take items by warp groups, not in batches of 2"),
    ("scores-mma-shape", [("mma_dots: {default: 0, sm90: 1}", "mma_dots: {default: 0, sm90: 1}\n    block: 64")], "sm90", 1,
     "mma_dots: {default: 0, sm90: 1}", "the tensor-core dots take 128-dim keys in blocks of 8 tiles of 16"),
    ("scores-ahead-too-deep", [(AHEAD, "tiles_ahead: {default: 3, sm90: 8}")], "sm90", 1,
     "tiles_ahead: {default: 3, sm90: 8}", "8 tiles ahead: at most 7"),
    ("scores-ring-too-large", [(AHEAD, "tiles_ahead: {default: 3, sm90: 6}")], "sm90", 1,
     "tiles_ahead: {default: 3, sm90: 6}", "16 rings of 7 tiles (229376 bytes) do not fit the"),
    ("scores-iq-first-cuda-cores", [("    " + AHEAD + "\n", "    " + AHEAD + "\n    iq_first: 1\n")],
     "gfx950", 1, "iq_first: 1", "iq_first orders the tensor-core dots' start"),
    ("scores-static-items-cuda-cores",
     [("static_item_starts: {default: 0, sm90: index_heads == 1}", "static_item_starts: 1")],
     "gfx950", 1, "static_item_starts: 1", "static_item_starts shapes the tensor-core dots' unrolled tile loop"),
    ("scores-item-table-cuda-cores", [("item_table: {default: 0, sm90: 1}", "item_table: 1")],
     "gfx950", 1, "item_table: 1", "item_table serves the tensor-core dots' streams"),
    ("scores-too-busy", [("busy_waves: 8 ", "busy_waves: {default: 8, sm90: 200} ")], "sm90", 16,
     "busy_waves: {default: 8, sm90: 200}", "200 busy waves: at most 128 (16 waves, 8 an item)"),
    # a generic timeline point a kind does not stamp is refused, not left at 0
    ("heads-done-point-unstamped", [("    ik_off: IK_OFF\n", "    ik_off: IK_OFF\n    done_point: spare\n")], "sm90", 1,
     "done_point: spare", "a head_norm_rope stage does not stamp done_point"),
    # the head tasks: one per q head, then k, v, index q, index k
    ("heads-tasks-vs-q-heads", [("tasks: N_HEAD_TASKS", "tasks: N_HEAD_TASKS - 1")], "gfx950", 3,
     "tasks: N_HEAD_TASKS - 1", "19 tasks != q_heads + 4 = 20"),
    ("heads-q-heads-vs-tasks", [("    q_heads: LOCAL_Q_HEADS\n", "    q_heads: LOCAL_Q_HEADS + 1\n")], "sm90", 1,
     "tasks: N_HEAD_TASKS", "20 tasks != q_heads + 4 = 21"),
    ("heads-outside-grid-sm90", [("sm90: {round_robin: {first: 112}}", "sm90: {round_robin: {first: 132}}")], "sm90", 1,
     "sm90: {round_robin: {first: 132}}", "outside the grid of 132 CTAs"),
    ("heads-fixed-overlaps-norm",
     [("placement: {round_robin: {first: 160}}   # CTAs that", "placement: {fixed: {first: 160, count: 16}}   # CTAs that"),
      ("placement: {round_robin: {first: 160}}   # the CTAs", "placement: {fixed: {first: 170, count: 20}}   # the CTAs")],
     "gfx950", 3, "{fixed: {first: 170, count: 20}}", "overlap stage 'norm'"),
    ("heads-unknown-region", [("    qkv: qkv\n", "    qkv: qkvv\n")], "sm90", 1, "qkv: qkvv", "no scratch region 'qkvv'"),
    ("heads-done-unknown-region", [("    done: hdone\n", "    done: hdon\n")], "sm90", 1, "done: hdon", "no scratch region 'hdon'"),
    ("heads-region-wrong-kind", [("    qkv: qkv\n", "    qkv: x8\n")], "sm90", 1, "qkv: x8", "is words, this needs pairs"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refused_build_is_located(case):
    _, edits, target, tokens, mark, fragment = case
    text = TEXT
    for old, new in edits:
        text = edit(text, old, new)
    loaded = parse_spec(text, "bad.yaml")  # the spec itself is well-formed
    build = make_build(loaded, target, **(tokens if isinstance(tokens, dict) else {"tokens": tokens}))
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
    loaded = parse_spec(edit(TEXT, QKV_TILE, QKV_TILE.replace("gfx942: 8}", "gfx942: 16}")), "bad.yaml")
    assert lower(loaded, make_build(loaded, "gfx942", tokens=8)).lds_bytes <= TARGETS["gfx942"].lds_bytes
    for target in ("gfx950", "sm90"):
        lower(loaded, make_build(loaded, target, tokens=16))
    with pytest.raises(SpecError, match="LDS"):
        lower(loaded, make_build(loaded, "gfx942", tokens=16))


def test_lower_by_name_and_values():
    ir = lower(SPEC, target="gfx942", tokens=16)
    assert ir.build.target == "gfx942" and stage_named(ir, "qkv").values["tile"] == 8
    ir = lower(SPEC, target="sm90", tokens=4, static_kv_scale=True, kv_page_stride=8)
    assert dict(ir.build.params)["kv_page_stride"] == 8 and stage_named(ir, "heads").values["static_kv_scale"] is True
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
        ({"kv_page_stride": 4}, r"kv_page_stride=4 is not allowed; values: \[8, 16\]"),
        ({"kv_page_stride": 16.0}, r"kv_page_stride=16.0 must be of type int"),
        ({"kv_page_stride": True}, r"kv_page_stride=True must be of type int"),
        ({"static_kv_scale": 1}, r"static_kv_scale=1 must be of type bool"),
        ({"static_kv_scale": "true"}, r"static_kv_scale='true' must be of type bool"),
    ],
)
def test_make_build_refuses(values, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_build(load_spec(SPEC), "sm90", **values)


def test_make_build_refuses_unknown_target():
    with pytest.raises(ValueError, match="unknown target 'sm80'"):
        make_build(load_spec(SPEC), "sm80")


def test_lds_buffers_keep_their_alignment():
    """A stage's LDS buffer may ask for an alignment above 16 bytes, up to the dynamic LDS's
    declared 1024 (sm90's 128-byte-swizzled wgmma operands): packed from the stage's base at the
    next multiple, the buffers after it from its end; the room checks count the padding."""
    from codegen.lower import LDS_ALIGN, MAX_LDS_ALIGN, _pack_lds

    bufs = [("s", "a", "u32", 5), ("s", "x", "u32", 300), ("s", "b", "float", 3), ("t", "y", "u64", 1)]
    offsets, used = _pack_lds(bufs, {("s", "x"): 1024, ("t", "y"): 1024})
    assert offsets == [0, 1024, 1024 + 1200, 0] and used == {"s": 1024 + 1200 + 16, "t": 16}
    assert _pack_lds(bufs, {})[0] == [0, 32, 32 + 1200, 0]  # 16-byte packing otherwise
    assert (LDS_ALIGN, MAX_LDS_ALIGN) == (16, 1024)
    from codegen.lower import _Ctx

    ctx = _Ctx.__new__(_Ctx)
    ctx.lds_bufs, ctx.lds_aligns = [], {}
    for bad in (8, 24, 2048):
        with pytest.raises(ValueError, match="alignment"):
            ctx.lds("s", "x", "u32", 4, align=bad)
    ctx.lds("s", "x", "u32", 4, align=256)
    assert ctx.lds_aligns == {("s", "x"): 256}


def test_scorer_first_keys_prefetch():
    """keys_prefetch (sm90; the spec's up to INLINE_NORM_TOKENS rows): the qkv GEMV's last thread,
    after the inline norm and before the staged weights' wait, prefetches the scorer CTA's first
    item's keys into L2 (its requests from seq_lens, then the item's block-table entry), and the
    index q's inputs (gamma's two lines, each token's cos / sin row: make_index_q's loads); a
    forward declaration lets the GEMV call the later stage. Tuned on where the GEMV reads its rows
    from the norm stage: before the wait for them, after the weights are asked for; with
    keys_prefetch_items n, the CTA's first n items. Refused on AMD and at a stage that is not an
    earlier gemv_fp8."""
    from codegen.render import render
    for tokens, on in ((1, True), (2, True), (3, False), (16, False)):
        ir = build_ir("sm90", tokens)
        assert stage_named(ir, "scores").values["keys_prefetch_at"] == ("qkv" if on else None)
        text = render(ir)
        assert ("stage_scores::prefetch_first_keys(a);" in text) is on
        if on:
            gemv = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
            call = gemv.index("if (tid == THREADS - 1) stage_scores::prefetch_first_keys(a);")
            assert gemv.index("stamp(lds, TL_X8_READY);") < call < gemv.index("bulk_wait(wbar")  # (S = 1: a segment's)
            assert text.index("namespace stage_scores { MONO_DEVICE void prefetch_first_keys(const Args& a); }") \
                < text.index("namespace stage_qkv {")
            assert "bulk_prefetch_l2(a.index_cache + page_of(a, it, q_len) * BLOCK * DIM, BLOCK * DIM);" in text
            pre = text[text.index("MONO_DEVICE void prefetch_first_keys(const Args& a) {"):]
            pre = pre[:pre.index("\n}\n")]
            assert "constexpr int PREFETCH_ITEMS = 1;" in pre and "int u = item_of(deal, j);" in pre and "const Deal deal = deal_of(c, work_items(reqs, requests));" in pre
            assert "for (int i = 0; i < DIM * 2; i += 128) prefetch_line_l2(reinterpret_cast<const u8*>(a.g_iq) + i);" in pre
            assert "prefetch_line_l2(a.cos_sin + (long long)int(a.positions[tk]) * ROPE);" in pre
            # gamma: 128 bf16, two 128-byte lines; a cos / sin row: 64 bf16, one
            assert "constexpr int DIM = 128;" in text and "constexpr int ROPE = 64;" in text
    # rows from the norm stage: the call goes before their wait, the CTA's first 4 items
    tuned = load_spec(SPEC, tune_items({"scores.keys_prefetch": 1, "scores.keys_prefetch_items": 4, "scores.early_setup": 0}))
    for tokens in (4, 16):
        text = render(lower(tuned, make_build(tuned, "sm90", tokens=tokens)))
        gemv = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
        order = ["if (WEIGHTS_FIRST) issue_weights();", "if (tid == THREADS - 1) stage_scores::prefetch_first_keys(a);",
                 "mailbox_wait<true>(mb.x8s + tid, mb.tag)", "stamp(lds, TL_X8_READY);"]
        assert [gemv.index(o) for o in order] == sorted(gemv.index(o) for o in order)
        assert gemv.count("prefetch_first_keys(a);") == 1 and "constexpr int PREFETCH_ITEMS = 4;" in text
    on = {"scores.keys_prefetch": 1}
    with pytest.raises(SpecError, match="gfx950's device library has no L2 prefetch"):
        lower(loaded := load_spec(SPEC, tune_items(on)), make_build(loaded, "gfx950", tokens=1))
    with pytest.raises(SpecError, match="keys_prefetch needs an earlier gemv_fp8 stage of this build, got 'heads'") as e:
        lower(loaded := load_spec(SPEC, tune_items({**on, "scores.keys_prefetch_at": "heads"})),
              make_build(loaded, "sm90", tokens=4))
    assert "pre_attn.yaml:" in str(e.value)
    with pytest.raises(SpecError, match=r"keys_prefetch_items: .* must be an integer >= 1, got 0"):
        lower(loaded := load_spec(SPEC, tune_items({**on, "scores.keys_prefetch_items": 0})),
              make_build(loaded, "sm90", tokens=1))


def test_scorer_late_ctas(tmp_path):
    """late_ctas / late_items (the spec's sm90: 48 / 4 up to 2 rows, 20 / 6 above): the last
    late_ctas ranks take late_items items fewer; few_* (the spec's sm90 above 2 rows: up to 24
    items a CTA, lead 28 and 48 late ranks 6 items fewer) a second deal for short work lists.
    The rendered deal_of, item_of and cta_items, compiled for the host (zig's clang) with the
    build's constants, deal every work list (0 .. 30 rounds of 132 CTAs: both deals) to the CTAs
    exactly once, each CTA's items in increasing order and none past its count; at 9 and 30
    rounds each late rank holds at least late_items - 1 fewer than any other, and the deal is the
    one its item count asks for. Off: the plain rounds, dealt the same way.
    Refused with every CTA late, in either deal."""
    import subprocess
    import sys
    from codegen.render import render

    def scores_of(tune):
        loaded = load_spec(SPEC, tune_items(tune))
        text = render(lower(loaded, make_build(loaded, "sm90", tokens=16)))
        return text[text.index("namespace stage_scores {"):]

    spec = scores_of({})
    assert "constexpr int LATE_CTAS = 20, LATE_ITEMS = 6;" in spec
    assert "constexpr int FEW_ITEMS = 24, FEW_LEAD = 28, FEW_LATE_CTAS = 48, FEW_LATE_ITEMS = 6;" in spec
    plain = scores_of({"scores.late_ctas": 0, "scores.few_items": 0})
    assert "constexpr int LATE_CTAS = 0, LATE_ITEMS = 0;" in plain and "FEW_ITEMS" not in plain
    tuned = scores_of({"scores.late_ctas": 20, "scores.late_items": 4, "scores.lead_cta": 0, "scores.few_items": 0})
    assert "constexpr int LATE_CTAS = 20, LATE_ITEMS = 4;" in tuned and "FEW_ITEMS" not in tuned
    for text in (spec, tuned, plain):
        for call in ("item_at(reqs, pages, st.cur, deal, j, requests)",  # the table's, else (past it):
                     "return advance(reqs, cur, item_of(deal, j), requests);",
                     "advance(reqs, own, item_of(deal_of(c, work_items(reqs, requests)), j), requests)",  # own_item
                     "item_at(reqs, pages, cur, deal, gr.id + k * gr.COUNT, requests)",
                     "const Deal deal = deal_of(c, work_items(reqs, requests));"):
            assert call in text
        assert "* CTAS, requests)" not in text  # every item index through item_of

    def functions(text):
        a = text.index("constexpr int LEAD")
        b = text.index("\n", a)
        c = text.index("// The work list's deal.")
        return text[a:b + 1] + text[c:text.index("// An item's block in the index cache")]

    # (text, the deal's late ranks and items fewer at 9 rounds, then at 30)
    for text, deals in ((spec, ((48, 6), (20, 6))), (tuned, ((20, 4), (20, 4))), (plain, ((0, 0), (0, 0)))):
        harness = ("#include <cstdio>\n#define MONO_DEVICE\nstruct Request { int count; };\n"
                   "constexpr int CTAS = 132, TOKENS = 1;\n" + functions(text) + """
int main() {
    const int deals[2][3] = {{9, @L9@, @I9@}, {30, @L30@, @I30@}};
    for (int total = 0; total <= 132 * 30; ++total) {
        static int seen[132 * 30 + 1];
        for (int u = 0; u < total; ++u) seen[u] = 0;
        Request req{total};
        int min_early = 1 << 30, max_late = 0, late = 0, fewer = 0;
        for (int c = 0; c < CTAS; ++c) {
            const Deal d = deal_of(c, work_items(&req, 1));
            const int n = cta_items(d);
            if (item_of(d, n) < total) { printf("CTA %d: item %d past its count\\n", c, n); return 1; }
            for (int j = 0; j < n; ++j) {
                const int u = item_of(d, j);
                if (u < 0 || u >= total || (j && u <= item_of(d, j - 1))) { printf("CTA %d item %d: %d\\n", c, j, u); return 1; }
                ++seen[u];
            }
            if (d.rank < d.early) min_early = n < min_early ? n : min_early;
            else max_late = n > max_late ? n : max_late, ++late;
            fewer = d.late_items;
        }
        for (const auto& x : deals) {
            if (total != 132 * x[0]) continue;
            if (late != x[1] || fewer != x[2]) { printf("%d rounds: %d late, %d fewer\\n", x[0], late, fewer); return 1; }
            if (late && min_early - max_late < fewer - 1) {  // the late ranks fewer
                printf("%d rounds: early ranks %d items or more, late %d\\n", x[0], min_early, max_late);
                return 1;
            }
        }
        for (int u = 0; u < total; ++u)
            if (seen[u] != 1) { printf("total %d: item %d dealt %d times\\n", total, u, seen[u]); return 1; }
    }
    printf("ok\\n");
    return 0;
}
""".replace("@L9@", str(deals[0][0])).replace("@I9@", str(deals[0][1]))
                   .replace("@L30@", str(deals[1][0])).replace("@I30@", str(deals[1][1])))
        cpp, exe = tmp_path / "deal.cpp", tmp_path / "deal"
        cpp.write_text(harness)
        subprocess.run([sys.executable, "-m", "ziglang", "c++", "-O1", "-std=c++17", str(cpp), "-o", str(exe)], check=True)
        assert subprocess.run([str(exe)], capture_output=True, text=True).stdout.strip() == "ok"
    with pytest.raises(SpecError, match="132 late CTAs of the stage's 132"):
        scores_of({"scores.late_ctas": 132, "scores.late_items": 1})
    with pytest.raises(SpecError, match="few_late_ctas.*132 late CTAs of the stage's 132"):
        scores_of({"scores.few_late_ctas": 132})


def test_scorer_early_setup():
    """early_setup (the spec's sm90 above 2 rows; early_setup_at: qkv): the scorer's setup (requests, context
    lengths, first pages) is a function that the qkv GEMV calls with every thread where its CTAs
    wait (S <= 2: after the inline norm's rows, before the staged weights' wait; above: before the
    wait for the norm stage's rows), into LDS after the union; run() sets up only on CTAs outside
    the qkv stage; they compile without spills. Off, run() calls setup() at the scorer's start.
    Refused where early_setup_at is not an earlier gemv_fp8 stage, or one whose CTAs may return
    before the call (no stream-K, or a long step's condition)."""
    from codegen.render import render

    def build(tune, tokens, target="sm90"):
        loaded = load_spec(SPEC, tune_items(tune))
        ir = lower(loaded, make_build(loaded, target, tokens=tokens))
        return ir, render(ir)

    call = "stage_scores::setup(a, lds);  // the scores stage's requests and first pages into LDS while "
    for tokens, before in ((1, "bulk_wait(wbar + staged"), (16, "if (tid < TOKENS) xs[tid] = u32_as_float(mailbox_wait<true>(")):
        ir, _ = build({}, tokens)
        assert stage_named(ir, "scores").values["early_setup_at"] == (None if tokens <= 2 else "qkv")
        ir, plain = build({"scores.early_setup": 0}, tokens)
        assert stage_named(ir, "scores").values["early_setup_at"] is None
        assert call not in plain and "namespace stage_scores { MONO_DEVICE void setup(" not in plain
        run = plain[plain.index("namespace stage_scores {\n"):]
        run = run[run.index("MONO_DEVICE void run("):run.index("}  // namespace stage_scores")]
        assert "    setup(a, lds);\n" in run and "request_of(" not in run
        ir, tuned = build({"scores.early_setup": 1, "scores.keys_prefetch": 0}, tokens)
        assert stage_named(ir, "scores").values["early_setup_at"] == "qkv"
        gemv = tuned[tuned.index("namespace stage_qkv {"):tuned.index("}  // namespace stage_qkv")]
        assert gemv.count(call) == 1 and gemv.index(call) < gemv.index(before)
        assert "namespace stage_scores { MONO_DEVICE void setup(const Args& a, u8* lds); }" in tuned
        scores = tuned[tuned.index("namespace stage_scores {\n"):tuned.index("}  // namespace stage_scores")]
        run = scores[scores.index("MONO_DEVICE void run("):]
        assert "if (g < 0 || g >= stage_qkv::CTAS) setup(a, lds);" in run and "request_of(" not in run
        union = max(b.offset + b.nbytes for b in ir.lds if not b.whole_kernel)
        kept = {b.name: b for b in ir.lds if b.stage == "scores" and b.name in ("reqs", "seq", "pages")}
        assert len(kept) == 3 and all(b.whole_kernel and b.offset >= union for b in kept.values())
        from codegen import jit
        (report,) = jit.resource_report(tuned, "early_setup.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    with pytest.raises(SpecError, match="early_setup needs an earlier gemv_fp8 stage of this build, got 'heads'"):
        build({"scores.early_setup": 1, "scores.early_setup_at": "heads"}, 16)
    with pytest.raises(SpecError, match="stage 'qkv' may return before its wait on some of its CTAs"):
        build({"scores.early_setup": 1}, 16, "gfx942")  # no stream-K there
    ir, _ = build({"scores.early_setup": "tokens > INLINE_NORM_TOKENS"}, 2)  # the tune the A/B uses
    assert stage_named(ir, "scores").values["early_setup_at"] is None


def test_scorer_keys_prefetch_from_setup():
    """keys_prefetch and early_setup in the same stage (qkv; off in the spec above 2 rows): the
    prefetch takes the CTA's first keys_prefetch_items pages from the setup's LDS, one TMA
    prefetch a thread (prefetch_set_up_keys: no global load, so the setup's barriers wait for
    nobody's chain), and goes out once the GEMV's token rows are in LDS: after the rows' copy
    above 2 rows, after the setup at S = 1 (inline norm). prefetch_first_keys is not built; the
    builds compile without spills. Refused for more items than the setup's pages (THREADS)."""
    from codegen.render import render

    def build(tune, tokens):
        loaded = load_spec(SPEC, tune_items(tune))
        ir = lower(loaded, make_build(loaded, "sm90", tokens=tokens))
        return ir, render(ir)

    call = "stage_scores::prefetch_set_up_keys(a, lds);"
    setup = "stage_scores::setup(a, lds);"
    for tokens, after in ((1, setup), (4, "copy16_batched<ROW_BATCH>("), (16, "copy16_batched<ROW_BATCH>(")):
        ir, text = build({"scores.keys_prefetch": 1, "scores.keys_prefetch_items": 8, "scores.early_setup": 1}, tokens)
        scores = stage_named(ir, "scores").values
        assert (scores["keys_prefetch_at"], scores["early_setup_at"], scores["keys_from_setup"]) == ("qkv", "qkv", True)
        gemv = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
        assert gemv.count(call) == 1 and gemv.index(setup) <= gemv.index(after) < gemv.index(call)
        assert "prefetch_first_keys" not in text
        assert "namespace stage_scores { MONO_DEVICE void prefetch_set_up_keys(const Args& a, const u8* lds); }" in text
        body = text[text.index("MONO_DEVICE void prefetch_set_up_keys(const Args& a, const u8* lds) {"):]
        body = body[:body.index("\n}\n")]
        assert "tid >= 8) return;" in body and "a.index_cache" in body and "pages[tid]" in body
        assert "a.seq_lens" not in body and "a.block_table" not in body  # no global load
        from codegen import jit
        (report,) = jit.resource_report(text, "keys_from_setup.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    ir, _ = build({"scores.keys_prefetch": 1, "scores.early_setup": 0}, 4)  # apart: the old way, before the wait
    assert stage_named(ir, "scores").values["keys_from_setup"] is False
    with pytest.raises(SpecError, match="takes the setup's pages of the CTA's first 512 items"):
        build({"scores.keys_prefetch": 1, "scores.keys_prefetch_items": 600}, 4)


def test_scorer_index_q_knobs():
    """iq_first (tensor-core dots): make_index_q before the first key tiles are asked for, not
    after; refused on the CUDA-core dots (their first batch's keys go into registers first).
    iq_from_out: make_index_q polls each row as the tagged pairs the head task puts beside iq_out
    (heads.iq_tagged, into region iqp: 16-byte couples, no done flag, no second load), instead of
    the norm + RoPE of the qkv rows; on the AMD builds too; the two knobs must agree; refused with
    four index heads (iq_out holds only the own head). iq_first is off in the spec; iq_from_out is
    sm90's with one index head (bench/NOTES.md, MiniMax sessions 20 / 21 / 29 / 31)."""
    from codegen.render import render

    def scores_of(tune, target="sm90", tokens=16, **params):
        loaded = load_spec(SPEC, tune_items(tune))
        text = render(lower(loaded, make_build(loaded, target, tokens=tokens, **params)))
        return text[text.index("namespace stage_scores {"):]

    ask = "for (int s = 0; s < RING - 1; ++s) ask_next_tile("
    for tune, first in (({}, False), ({"scores.iq_first": 1}, True)):
        groups = scores_of(tune)
        groups = groups[groups.index("MONO_DEVICE void score_by_groups("):]
        assert (groups.index("make_index_q(a, mb, reqs, iq, requests, q_len") < groups.index(ask)) is first
        assert groups.count(ask) == 1
    with pytest.raises(SpecError, match="iq_first orders the tensor-core dots' start"):
        scores_of({"scores.iq_first": 1, **CUDA_CORES})

    made = "norm_rope(e, g, c, sn, d0, out);"
    read = ["const u64* const couple[1] = {mb.iqp + (tk * DIM + d0) / 2};", "mailbox_wait_all2(couple, mb.tag, w);"]
    put = "mailbox_put2(mb.iqp + (tk * DIM + d0) / 2, lo, hi, mb.tag);"
    off, on = {"scores.iq_from_out": 0, "heads.iq_tagged": 0}, {"scores.iq_from_out": 1, "heads.iq_tagged": 1}
    for target in ("sm90", "gfx950"):
        loaded = load_spec(SPEC, tune_items(on))
        whole = render(lower(loaded, make_build(loaded, target, tokens=16)))
        plain, tuned = scores_of(off, target), whole[whole.index("namespace stage_scores {"):]
        iq = lambda text: text[text.index("MONO_DEVICE void make_index_q("):text.index("struct Cursor {")]
        assert made in iq(plain) and not any(r in iq(plain) for r in read)
        assert made not in iq(tuned) and all(r in iq(tuned) for r in read)
        head = whole[whole.index("MONO_DEVICE void head("):]
        assert whole.count(put) == 1 and put in head[:head.index("MONO_DEVICE void run(")]  # the index-q task's
        assert put not in scores_of(off, target)
        assert "HEAD_TASKS = 20, TASK_IK = 19;" in tuned
    for one in ({"scores.iq_from_out": 1, "heads.iq_tagged": 0}, {"scores.iq_from_out": 0, "heads.iq_tagged": 1}):
        with pytest.raises(SpecError, match="give heads.iq_tagged iq_from_out's value"):
            scores_of(one)
    for tokens, index_heads, polled in ((1, 1, True), (2, 1, True), (16, 1, True), (16, 4, False)):  # the spec's, sm90
        assert (made not in iq(scores_of({}, tokens=tokens, index_heads=index_heads))) is polled
    assert made in iq(scores_of({}, "gfx950", tokens=16))
    with pytest.raises(SpecError, match="the head tasks write only the own index-q head to iq_out, not all 4"):
        scores_of(on, tokens=4, index_heads=4)


def test_every_sm90_row_count_lowers():
    """Every sm90 build of 1..16 rows lowers. At 15 rows the GEMV's weights all staged in LDS
    (230464 B of the stage) fit the target only without the scorer's kernel-lifetime setup
    buffers, which the scorer declares after the GEMV planned its LDS: the lowering sees the whole
    overflow and plans again around them, so that the GEMV keeps a segment in registers as at 16."""
    sizes = {}
    for tokens in range(1, 17):
        ir = build_ir("sm90", tokens)
        assert ir.lds_bytes <= ir.target.lds_bytes
        sizes[tokens] = stage_named(ir, "qkv").values["all_staged"]
    assert sizes[14] and not sizes[15] and not sizes[16]
