"""Lowering of specs/deepseek_v41/attn_front.yaml: the scratch layout of
contract B.8, the flag copies of tuned builds, stage presence and placement
per build, LDS budgets per target, the MX maximum per FP8 flavour, and
located refusals of broken edits."""

from __future__ import annotations

import pytest

from codegen.lower import lower, make_build
from codegen.render import render
from codegen.spec import SpecError, load_spec, parse_spec
from codegen.spec.load import spec_path
from codegen.targets import TARGETS
from tests import deepseek_case as dc

SPEC = "deepseek_v41/attn_front"
TEXT = spec_path(SPEC).read_text()


def ir_of(target="sm90", tune=None, **params):
    from codegen.spec.load import tune_items
    loaded = load_spec(SPEC, tune_items(tune)) if tune else load_spec(SPEC)
    return lower(loaded, make_build(loaded, target, **params))


@pytest.mark.parametrize("tokens,offsets", [
    (1, [0, 5120, 5888, 6144, 34816, 36096, 36352]),
    (16, [0, 81920, 92160, 92416, 551168, 571648, 574208]),
    (48, [0, 245760, 276480, 277248, 1653504, 1714944, 1722624]),
])
def test_scratch_layout_is_b8(tokens, offsets):
    """Contract B.8's layout; where sm90's wqkv partials come in 4 K quarters, not 2 halves (TP4),
    its xrdy and qkvp regions hold twice the pairs, the same regions in the same order. (sm90's
    QX8 is wq_b's LDS image, whole 8-token groups: B.8's bytes at these S, other places inside.)"""
    for target in [t for t in TARGETS if t != "sm90"]:
        ir = ir_of(target, tokens=tokens)
        assert [r.name for r in ir.regions] == ["x8", "x8s", "xrdy", "qkvp", "qx8", "qx8s", "qrdy"]
        assert [r.offset for r in ir.regions] == offsets, target
    # sm90 TP4: 4 K quarters, twice the xrdy flags and the partials
    b8, sm90 = ir_of("gfx950", tokens=tokens), ir_of(tokens=tokens)
    assert [(r.name, r.offset) for r in sm90.regions[:3]] == [(r.name, r.offset) for r in b8.regions[:3]]
    assert sm90.region("xrdy").count == 2 * b8.region("xrdy").count
    assert sm90.region("qkvp").count == 4 * tokens * 1792 == 2 * b8.region("qkvp").count


@pytest.mark.parametrize("tokens", [1, 6, 48])
def test_tuned_flag_copies(tokens):
    ir = ir_of(tokens=tokens, tuned=True)
    k_parts = next(c.value for c in ir.constants if c.name == "K_PARTS")
    for name, per_copy in (("xrdy", k_parts * tokens), ("qrdy", tokens)):
        r = ir.region(name)
        stride = -(-per_copy // 32) * 32  # each copy its own 256-byte stretch
        assert r.count == 8 * stride and r.offset % 256 == 0 and (stride * 8) % 256 == 0
    text = render(ir)
    assert "constexpr int COPIES = 8;" in text
    # wq_b's QX8 flags (S = 1 too: no q_inline at sm90 TP4), where QX8 is not tagged pairs (the spec's
    # sm90 up to 15 rows but 6: no flags to poll then)
    flagged = render(ir_of(tokens=tokens, tuned=True, tune={"symbols.QX8_TAGGED": 0}))
    assert "block_id() % COPIES" in flagged and ("block_id() % COPIES" in text) == (not dc.tagged_qx8(ir) or tokens > 8)
    q_inline = render(ir_of(tokens=1, tp=2, tuned=True))  # TP2 S = 1: wq_b norms q itself, xq is off: no flag waits
    assert "constexpr int COPIES = 8;" in q_inline and "block_id() % COPIES" not in q_inline


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("tokens", [1, 16, 17, 48])
def test_stages_and_placement(target, tokens):
    if target == "sm90":  # the spec's K quarters (no q_inline): test_wqkv_quarters; here halves, as TP2's
        ir = ir_of(target, tokens=tokens, tune={"symbols.WQKV_QUARTERS": 0, "symbols.INLINE_Q_TOKENS": 2})
    else:
        ir = ir_of(target, tokens=tokens)
    st = {s.name: s for s in ir.stages}
    assert ("xq" in st) == (tokens > 8)
    n_wqkv = 224
    free = n_wqkv if ir.blocks >= n_wqkv else n_wqkv - ir.blocks  # first CTA with one wqkv unit or none
    assert st["kt"].first == free and st["wqkv_a"].ctas == ir.blocks
    if "xq" in st:
        assert st["xq"].first == free and st["xq"].tasks == 2 * tokens
    assert st["wq_b"].tasks == 16 * 512 // 16
    # q_inline builds (S = 1): the qkv task on the last CTA, which has no wq_b unit (sm90), or on
    # the CTAs with no wqkv unit; sm90 S 9..20: the last S CTAs, each with one wqkv unit and no kt
    # task, and no more wq_b units than any other CTA (the last 4: none)
    if target == "sm90" and 9 <= tokens <= 20:
        first = st["qkv"].first
        assert first == ir.blocks - tokens and first >= free
        assert st["kt"].first + min(tokens, st["kt"].ctas) <= first
        wqb = st["wq_b"]
        units = [len(range(c - wqb.first, wqb.tasks, wqb.ctas)) if wqb.first <= c < wqb.first + wqb.ctas else 0
                 for c in range(ir.blocks)]
        assert max(units[first:]) <= min(units[:first])
    else:
        assert st["qkv"].first == (0 if tokens > 1 else 131 if target == "sm90" else n_wqkv)
    # sm90: whole wgmma groups on 128 CTAs (the last 4 free for the qkv tasks); q_inline: all but the qkv CTA
    assert st["wq_b"].ctas == (ir.blocks if target != "sm90" else 131 if tokens == 1 else 128)
    assert ir.lds_bytes <= ir.target.lds_bytes
    assert ir.tag_stride == 2 and ir.layer_arg is None and ir.counter_arg == "epoch"


@pytest.mark.parametrize("target", list(TARGETS))
def test_index_tuned_tp2(target):
    ir = ir_of(target, tokens=48, index=True, tuned=True, tp=2)
    st = {s.name: s for s in ir.stages}
    assert "kt" not in st
    assert st["qkv"].first == (224 if ir.blocks >= 224 else 224 - ir.blocks)
    assert st["wq_b"].tasks == 32 * 512 // 16
    assert ir.arg("q").shape == (48, 32, 512)
    assert ir.lds_bytes <= ir.target.lds_bytes


def test_mx_fp8_max_per_flavour():
    assert "MX_FP8_MAX = 224.0f" in render(ir_of("gfx942", tokens=4))
    assert "MX_FP8_MAX = 448.0f" in render(ir_of("gfx950", tokens=4))
    assert "MX_FP8_MAX = 448.0f" in render(ir_of("sm90", tokens=4))


def test_runtime_dims():
    ir = ir_of(tokens=3)
    assert ir.arg("swa").shape == ("swa_bytes",)
    assert ir.arg("cos_sin").shape == ("max_pos", 64)
    assert ir.arg("comp_bt").shape == ("comp_reqs", "comp_cols")


def edit(old, new):
    assert TEXT.count(old) == 1, old
    return TEXT.replace(old, new)


@pytest.mark.parametrize("old,new,message", [
    ("    x_from: qkv\n", "    x_from: kt\n", "no stage 'kt' of kind mxfp8_quant or mla_norm_rope"),
    ("    flag_stride: QRDY_STRIDE\n", "    flag_stride: 1\n", "flag_stride 1 < 4 flags"),
    ("    done_point: wqkv_done\n", "    done_point: wqkv_finished\n", "no timeline point 'wqkv_finished'"),
    ("    tasks: Q_ROWS // 16\n", "    tasks: Q_ROWS // 32\n", "tasks != (rows / 16) x k_parts"),
    ("    tokens_per_task: QKV_PER_TASK\n", "    tokens_per_task: 3\n", "3 tokens a task need 768 threads"),
    ("    tokens_per_task: QKV_PER_TASK\n", "    tokens_per_task: 2\n", "one task per 2 token(s) expected: 2 at 4 tokens, got 4"),
])
def test_refusals_are_located(old, new, message):
    text = edit(old, new)
    loaded = parse_spec(text, "attn_front.yaml")
    with pytest.raises(SpecError) as e:
        lower(loaded, make_build(loaded, "sm90", tokens=4))
    assert message in str(e.value)
    assert "attn_front.yaml:" in str(e.value)


# wq_b's sm90 knobs: (tp, tokens) -> (staged units, group); TP4: 4 units a CTA, TP2: 8; at S = 48
# the wqkv stage's LDS leaves room for 3 units' weights at TP2 (halves: 156 KB), all 4 at TP4 (K
# quarters: a quarter of the rows) (the spec turns the bulk weights and the ILP loop off there,
# measured slower on the H200: turned on here)
@pytest.mark.parametrize("tp,tokens,staged,group", [
    (4, 1, 4, 4), (4, 6, 4, 4), (4, 16, 4, 2), (4, 48, 4, 2),
    (2, 1, 8, 3), (2, 6, 8, 3), (2, 16, 8, 2), (2, 48, 3, 1),
])
def test_wqb_bulk_weights_layout(tp, tokens, staged, group):
    if tokens > 16:
        assert not next(s for s in ir_of(tokens=tokens, tp=tp).stages if s.name == "wq_b").values["bulk"]
    ir = ir_of(tokens=tokens, tp=tp, timeline=True,
               tune={"wq_b.bulk_weights": {"default": 0, "sm90": 1}, "wq_b.ilp": {"default": 0, "sm90": 1}, "wq_b.wgmma": 0})
    v = next(s for s in ir.stages if s.name == "wq_b").values
    assert v["ilp"] and v["bulk"] and v["prologue"] and (v["staged"], v["group"]) == (staged, group)
    union = max(b.offset + b.nbytes for b in ir.lds if not b.whole_kernel and b.stage != "kernel")
    w = next(b for b in ir.lds if b.qualified_name == "stage_wq_b::LDS_W")
    assert w.whole_kernel and w.offset >= union and w.nbytes == staged * 40 * 512  # beside every stage's LDS
    assert ir.lds_bytes <= ir.target.lds_bytes
    text = render(ir)
    assert "stage_wq_b::prologue(a, mb, lds);" in text and "mx_gemv16_units<GROUP" in text


# lds_weights: the same bulk copies issued at wq_b's start, into its own LDS (the union, not
# beside it), the scale codes there too (cp.async): (tp, tokens) -> (staged units, group)
@pytest.mark.parametrize("tp,tokens,staged,group", [
    (4, 1, 4, 4), (4, 2, 4, 4), (4, 16, 4, 2), (4, 48, 4, 2), (2, 1, 8, 3), (2, 48, 6, 1),
])
def test_wqb_lds_weights_layout(tp, tokens, staged, group):
    ir = ir_of(tokens=tokens, tp=tp, timeline=True,
               tune={"wq_b.lds_weights": {"default": 0, "sm90": 1}, "wq_b.ilp": {"default": 0, "sm90": 1}, "wq_b.wgmma": 0})
    v = next(s for s in ir.stages if s.name == "wq_b").values
    assert v["bulk"] == "stage" and not v["prologue"] and (v["staged"], v["group"]) == (staged, group)
    bufs = {b.qualified_name: b for b in ir.lds}
    w, codes = bufs["stage_wq_b::LDS_W"], bufs["stage_wq_b::LDS_WCODES"]
    assert not w.whole_kernel and not any(b.whole_kernel for b in ir.lds)  # a stage buffer: reused after
    assert w.nbytes == staged * 40 * 512 and codes.nbytes >= (staged // 2 + 1) * 40  # the rows the units span
    assert ir.lds_bytes <= ir.target.lds_bytes
    text = render(ir)
    run = text[text.index("MONO_DEVICE void run(", text.index("namespace stage_wq_b {")):]
    assert "prologue(a, mb, lds)" not in text
    assert run.index("copy_units(a, lds);") < run.index("stage_rows(") < run.index("copy_async_wait();") \
        < run.index("bulk_wait(") < run.index("mx_gemv16_units<GROUP") < run.index("bulk_barrier_inval(")
    assert "load_scales(lds + LDS_WCODES" in run and "load_scales(a.wqb_s" not in run


def test_wqb_mma_in_the_spec():
    """The spec's wq_b MMAs: native fp8 wgmma at sm90, TP2's 8 units a CTA in two groups of 4
    (weights in registers, no lds_weights: H200, TP4, S = 2 12.95 us against 13.80 with
    lds_weights and the emulated MMAs), MFMA on AMD."""
    for tp, tokens in ((4, 1), (4, 2), (4, 6), (4, 48), (2, 2), (2, 48)):
        v = next(s for s in ir_of(tokens=tokens, tp=tp).stages if s.name == "wq_b").values
        assert v["wgmma"] and v["bulk"] == "" and v["group"] == 4
    for target in ("gfx942", "gfx950"):
        v = next(s for s in ir_of(target, tokens=2).stages if s.name == "wq_b").values
        assert not v["wgmma"] and not v["bulk"]


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_wqb_knobs_off_on_amd(target):
    v = next(s for s in ir_of(target, tokens=16).stages if s.name == "wq_b").values
    assert not v["ilp"] and not v["bulk"] and not any(b.whole_kernel for b in ir_of(target, tokens=16).lds)


@pytest.mark.parametrize("tune,message", [
    ({"wq_b.bulk_weights": {"default": 1}}, "no ILP MXFP8 loop / bulk copies"),
    ({"wq_b.ilp": 0, "wq_b.bulk_weights": 1}, "the staged weights are read by the ILP loop"),
    ({"wqkv_a.ilp": 1, "wqkv_a.bulk_weights": 1}, "whole rows (k_parts: 1) needed"),
    ({"wq_b.lds_weights": {"default": 1}}, "no ILP MXFP8 loop / bulk copies"),
    ({"wq_b.ilp": 0, "wq_b.lds_weights": 1}, "the staged weights are read by the ILP loop"),
    ({"wq_b.bulk_weights": 1, "wq_b.lds_weights": 1}, "bulk_weights already moves the weights into LDS"),
    ({"wqkv_a.ilp": 1, "wqkv_a.lds_weights": 1}, "whole rows (k_parts: 1) needed"),
    ({"wq_b.wgmma": {"default": 1}}, "target gfx942 (sm90 only)"),
    ({"wq_b.wgmma": 1, "wq_b.lds_weights": 1}, "lds_weights on (the wgmma loop takes its weights in registers)"),
    ({"wq_b.wgmma": 1, "wq_b.bulk_weights": 1}, "bulk_weights on"),
    ({"wqkv_a.wgmma": 1, "symbols.WQKV_QUARTERS": 0}, "2 units a CTA (one a warp of each warpgroup: a multiple of 4 needed)"),
])
def test_wqb_knob_refusals(tune, message):
    from codegen.spec.load import tune_items
    loaded = load_spec(SPEC, tune_items(tune))
    target = "gfx942" if "default" in str(tune) else "sm90"
    with pytest.raises(SpecError) as e:
        lower(loaded, make_build(loaded, target, tokens=4))
    assert message in str(e.value)


@pytest.mark.parametrize("tp,tokens", [(4, 1), (4, 2), (4, 3), (4, 16), (4, 20), (4, 48), (2, 1), (2, 16), (2, 48)])
def test_wqb_wgmma_layout(tp, tokens):
    """wq_b.wgmma (the spec's at sm90): the CTA's 4 units a warpgroup's 4 warps, a quarter of the
    40 chunks a warpgroup (10 a warp), the token rows in LDS in the swizzled layout (whole groups of
    8 tokens, 1280 bytes a token: copied from QX8, or normed in place by q_inline: up to 2 rows at TP2), made
    visible to the async proxy before the barrier; one partial tile a warpgroup (4 to sum), and LDS
    for those only. TP2 (8 units a CTA): two groups, the second's weights loaded as the first's
    last pass frees their registers."""
    ir = ir_of(tokens=tokens, tp=tp)
    st = next(s for s in ir.stages if s.name == "wq_b")
    v = st.values
    assert v["wgmma"] and (v["group"], v["cpw"], v["groups"]) == (4, 10, 4) and not v["lds_scales"]
    assert not v["bulk"] and -(-st.tasks // st.ctas) == 16 // tp  # weights in registers; units a CTA
    x = next(b for b in ir.lds if b.qualified_name == "stage_wq_b::LDS_X")
    assert x.nbytes == -(-tokens // 8) * 8 * 1280
    # rows copied from QX8: the swizzled layout, its atoms 1024-byte aligned; normed in place
    # (q_inline, buffers before x): core matrices
    q_inline = tp == 2 and tokens <= 2  # the spec's INLINE_Q_TOKENS (sm90)
    assert v["q_inline"] is q_inline and v["swizzle"] is not q_inline and (x.offset % 1024 == 0 or q_inline)
    part = next(b for b in ir.lds if b.qualified_name == "stage_wq_b::LDS_PART")
    # 4 units x 4 warpgroup tiles of 16 rows x PART_ROW floats, a set for each 16-column pass (one
    # epilogue a group over all of them)
    assert v["passes"] == -(-tokens // 16) and part.nbytes == v["passes"] * 4 * 4 * 16 * 18 * 4
    assert ("epilogue_passes(a, mb, part, lds, b0, i0, UPC, tok0, nt);" in render(ir)) == (tokens > 16)
    text = render(ir)
    wqb = text[text.index("namespace stage_wq_b {"):text.index("}  // namespace stage_wq_b")]
    assert "constexpr int PART_WAVES = 4;          // partial tiles of a unit: one a warpgroup" in wqb and "mx_gemv64_wgmma<WGMMA_DEPTH, CPWG, GROUPS, NG, SSTRIDE, SWIZZLE>(" in wqb
    assert f"constexpr int WGMMA_DEPTH = {3 if tp == 4 else 2};" in wqb  # chunks in flight: the spec's
    assert f"constexpr bool SWIZZLE = {'false' if q_inline else 'true'};" in wqb
    assert "constexpr int PART_TILE = PART_WAVES * PART_WAVE;" in wqb
    rows = wqb[wqb.index("MONO_DEVICE void stage_rows("):]
    if q_inline:  # normed in place (core matrices), made visible to the async proxy
        assert rows.index("xl[item_word(r, tt)] = w0;") < rows.index("fence_proxy_async_lds();")
    elif dc.tagged_qx8(ir):  # polled from QX8's tagged pairs in row order (the spec's sm90 to 15 rows but 6), swizzled
        assert not v["tma_rows"] and v["tagged"] and ir.region("qx8").count == 2 * tokens * 320
        assert rows.index("xl + row_word(i / VECS, i % VECS)) = u32x4{") < rows.index("fence_proxy_async_lds();")
    elif tokens < 16 or (tp, tokens) == (2, 16):  # copied from QX8 in row order (16-byte loads), swizzled
        assert not v["tma_rows"] and ir.region("qx8").count == tokens * 320
        assert rows.index("xl + row_word(i / VECS, i % VECS)) = x;") < rows.index("fence_proxy_async_lds();")
    else:  # the qkv stage stored QX8 as this LDS image (spec QX8_IMAGE): one bulk copy, waited for before the barrier
        assert v["tma_rows"] and v["image_groups"] == -(-tokens // 8)
        qkv = next(s for s in ir.stages if s.name == "qkv").values
        assert qkv["image_groups"] == v["image_groups"] and ir.region("qx8").count == -(-tokens // 8) * 8 * 320
        assert "st8(mb.qx8 + qx8_word(t, tt), w0, w1);" in text
        assert "return swizzle128_item_word<IMAGE_GROUPS>(t, tt);" in text
        assert "return swizzle128_word<NG>(t, it / 2) + (it % 2) * 2;" in text  # the device library's item word
        run = wqb[wqb.index("MONO_DEVICE void run("):]
        assert run.index("bulk_barrier_init(reinterpret_cast<u64*>(lds + LDS_RBAR));") < run.index("await_rows(mb, kpart);")
        assert rows.index("fence_proxy_async();") < rows.index("bulk_copy(xl, mb.qx8 + swizzle128_word<IMAGE_GROUPS>(0, part * VECS), NG * 8 * KP, rbar);") \
            < rows.index("bulk_wait(rbar, 0, mb.tag);") < rows.index("copy_async_wait();") < rows.index("bulk_barrier_inval(rbar);")
    tile = "part + (c0 / 16) * PASS_TILE + r * PART_TILE + g * PART_WAVE" if tokens > 16 else "part + r * PART_TILE + g * PART_WAVE"
    assert tile in wqb and "LDS_WSC" not in wqb  # scales in registers
    epilogue = "epilogue_passes(a, mb, part, lds, b0, i0, UPC, tok0, nt)" if tokens > 16 else "epilogue_group(a, mb, part, lds, b0, i0, UPC,"
    assert "refill ? unit_weights(a, unit(i0 + 4 + r)) : nullptr" in wqb and epilogue in wqb
    # off: the emulated mma.sync loop and one tile a wave
    text = render(ir_of(tokens=tokens, tp=tp, tune={"wq_b.wgmma": 0}))
    wqb = text[text.index("namespace stage_wq_b {"):text.index("}  // namespace stage_wq_b")]
    assert "mx_gemv64_wgmma<" not in wqb and "constexpr int PART_WAVES = 16;          // partial tiles of a unit: one a wave" in wqb
    # lds_weights (TMA weights) and wgmma (weights in registers) exclude each other
    with pytest.raises(SpecError, match="lds_weights on"):
        ir_of(tokens=tokens, tp=tp, tune={"wq_b.lds_weights": {"default": 0, "sm90": 1}, "wq_b.ilp": {"default": 0, "sm90": 1}})


def test_ilp_without_bulk_groups_the_register_units():
    """ilp without bulk_weights: units go GROUP at a time from their registers (every unit whose
    weights were prefetched), split-K units (wqkv_a) too when no group of a CTA holds two K
    parts; one at a time otherwise. Where the group's weight loads times the token halves exceed
    the register budget (PREFETCH_LOADS), the group's weight scales go to LDS (in registers they
    spilled), else they stay in registers."""
    from codegen.spec.load import tune_items
    loaded = load_spec(SPEC, tune_items({"wq_b.bulk_weights": 0, "wq_b.wgmma": 0, "symbols.WQKV_QUARTERS": 0,
                                         "wqkv_a.ilp": {"default": 0, "sm90": 1}}))
    for tokens, group, wqkv_group in ((1, 4, 2), (6, 4, 2), (16, 4, 2), (17, 4, 2), (48, 4, 2)):
        ir = lower(loaded, make_build(loaded, "sm90", tokens=tokens))
        v = {s.name: s.values for s in ir.stages}
        assert (v["wq_b"]["group"], v["wqkv_a"]["group"]) == (group, wqkv_group)
        assert v["wq_b"]["lds_scales"] == (tokens > 8) == v["wqkv_a"]["lds_scales"]
        text = render(ir)
        wqb = text[text.index("namespace stage_wq_b {"):text.index("}  // namespace stage_wq_b")]
        wqkv = text[text.index("namespace stage_wqkv_a {"):text.index("}  // namespace stage_wqkv_a")]
        assert "prologue(a, mb, lds)" not in text and f"constexpr int GROUP = {group};" in wqb
        assert "mx_gemv16_units<GROUP, CPW" in wqb and "epilogue_group(a, mb, part, lds, b0, i0, UPC," in wqb
        scales_in_lds = "unpack_scales(sw[i0 + uu], swg[uu]);\n            wave_sync();" in wqb
        assert scales_in_lds == (tokens > 8) == ("LDS_WSC" in wqb)
        assert "constexpr int K_PARTS = 1;" in wqb and "return K_PARTS == 1 ? 0 :" in wqb  # k_parts 1: one part
        if wqkv_group > 1:  # each group stages its own part's rows, puts its partials there
            assert "const int kpart = unit_part(min_i(b0 + CTAS * i0, TASKS - 1));" in wqkv
            assert "stage_rows(a, mb, lds, kpart," in wqkv and "lds, unit_row0(u), unit_part(u), tok0" in wqkv
        else:
            assert "mx_gemv16_units<1, CPW, NC, XSTRIDE, SSTRIDE, WAVES * PART_WAVE>" in wqkv
    # the spec, wgmma off: TP2 above 16 tokens keeps the plain loop (its groups would spill)
    v = next(s for s in ir_of(tokens=48, tp=2, tune={"wq_b.wgmma": 0}).stages if s.name == "wq_b").values
    assert not v["ilp"] and v["group"] == 1


def test_groups_never_span_k_parts():
    from codegen.stages.gemv_mxfp8 import _group_spans_parts, unit_of
    assert sorted(unit_of(u, 224, 132) for u in range(224)) == list(range(224))
    assert not _group_spans_parts(224, 132, 112, 2)  # DeepSeek wqkv: the part boundary falls between CTAs
    assert _group_spans_parts(226, 132, 113, 2)      # CTA 56 would hold units 112 (part 0) and 113 (part 1)
    assert not _group_spans_parts(226, 132, 113, 1)


@pytest.mark.parametrize("pieces,threads,batch", [
    (320, 512, 1), (16 * 320, 512, 5), (16 * 160, 512, 5), (48 * 160, 512, 8), (48 * 80, 512, 8),
    (16 * 384, 512, 6), (17 * 512, 512, 6), (9 * 512, 256, 6),
])
def test_row_batch_evens_out_round_trips(pieces, threads, batch):
    from codegen.stages.gemv_fp8 import ROW_LOADS, row_batch
    trips = -(-pieces // threads)
    assert row_batch(pieces, threads) == batch <= ROW_LOADS
    # as few round trips as ROW_LOADS allows, and no batch larger than they need
    assert -(-trips // batch) == -(-trips // ROW_LOADS) and (batch - 1) * -(-trips // batch) < trips


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("tokens", [1, 16, 48])
def test_a_ctas_wqkv_units_share_their_k_part(target, tokens):
    """unit_of (the template's task -> unit order; its Python twin on the build's constants):
    every unit once, a CTA's units consecutive, so only a CTA across the K-part boundary
    stages its token rows twice."""
    ir = ir_of(target, tokens=tokens)
    st = next(s for s in ir.stages if s.name == "wqkv_a")
    text = render(ir)
    ns = text[text.index("namespace stage_wqkv_a {"):text.index("}  // namespace stage_wqkv_a")]
    assert "return c * UQ + min_i(c, UR) + u / CTAS;" in ns
    assert ("if (N_LDS_TILES > 1 || new_part)" in ns) is not st.values["wgmma"]  # wgmma: one K part a CTA
    tasks, ctas, row_tiles = st.tasks, st.ctas, 1792 // 16
    from codegen.stages.gemv_mxfp8 import unit_of
    unit = [unit_of(u, tasks, ctas) for u in range(tasks)]
    assert sorted(unit) == list(range(tasks))
    parts = {c: {unit[u] // row_tiles for u in range(c, tasks, ctas)} for c in range(ctas)}
    assert sum(len(p) - 1 for p in parts.values()) <= 1
    v = st.values
    assert f"constexpr int ROW_BATCH = {v['row_batch']};" in ns
    assert v["row_batch"] >= min(5, tokens) or v["row_batch"] * 512 >= tokens * v["kp"] // 16  # or one round trip


@pytest.mark.parametrize("tokens", [4, 5, 6, 7])
def test_qkv_pairs_without_tagged_qx8(tokens):
    """sm90 TP4: where QX8 goes by flags, 5 and 6 rows take two tokens a qkv task, on 3 of the 4
    CTAs without wq_b units; with tagged QX8 (the spec's up to 15 rows) one token a task, on the
    last 5 / 6 CTAs (H200: faster under the tagged polls, bench/NOTES.md DeepSeek session 26)."""
    for tagged in (0, 1):
        st = {s.name: s for s in ir_of(tokens=tokens, tp=4, tune={"symbols.QX8_TAGGED": tagged}).stages}
        per_task = 2 if not tagged and 5 <= tokens <= 6 else 1
        tasks = -(-tokens // per_task)
        assert (st["qkv"].tasks, st["qkv"].values["per_task"], st["qkv"].first) == (tasks, per_task, 132 - tasks)
        assert st["qkv"].values["tagged"] is bool(tagged)


@pytest.mark.parametrize("tp,tokens", [(4, 1), (4, 2), (4, 3), (4, 4), (4, 5), (4, 6), (4, 7), (4, 8), (4, 9), (4, 16), (4, 17), (4, 20), (4, 21), (4, 40), (4, 41), (4, 48),
                                       (2, 6), (2, 16)])
def test_wqkv_quarters(tp, tokens):
    """sm90 TP4: wqkv in K quarters, 4 units (64 rows of one quarter) on each of CTAs 0..111, on
    the native fp8 wgmma; xq (by quarters; S = 48: from CTA 68, 3 units each) and kt on CTAs
    112..131; the qkv stage sums (P_0 + P_1)
    + (P_2 + P_3) (q_inline would too: at S = 1 its 4 partials cost wq_b's CTAs more than the wgmma
    saves, so TP4 has none). Elsewhere (TP2, measured slower) halves, as on AMD."""
    ir = ir_of(tokens=tokens, tp=tp)
    st = {s.name: s for s in ir.stages}
    quarters = tp == 4
    k_parts = next(c.value for c in ir.constants if c.name == "K_PARTS")
    assert k_parts == (4 if quarters else 2) and st["wqkv_a"].values["wgmma"] is bool(quarters)
    assert st["wqkv_a"].tasks == 112 * k_parts and st["wqkv_a"].ctas == (112 if quarters else 132)
    free = 112 if quarters else 92
    xq_first = free - 44 * (quarters and tokens == 48)  # S = 48's units on 64 CTAs, 3 each (measured faster)
    assert st["kt"].first == free and ("xq" not in st or (st["xq"].first, st["xq"].tasks) == (xq_first, k_parts * tokens))
    # the qkv tasks on the last S CTAs where those have no wqkv unit (quarters, up to 20 tasks), and
    # wq_b's weights into L2 as those CTAs enter the qkv stage; else the first S CTAs
    # (q_inline, up to 2 rows at TP2: on the last CTA, which has no wq_b unit); one token a task
    # (two only where QX8 goes by flags: test_qkv_pairs_without_tagged_qx8)
    tasks = tokens
    on_last = quarters and tasks <= 20 or tp == 2 and 9 <= tokens <= 20
    q_inline = tp == 2 and tokens <= 2
    assert st["wq_b"].values["q_inline"] is q_inline
    assert (st["qkv"].tasks, st["qkv"].values["per_task"]) == (tasks, 1)
    assert st["qkv"].first == (132 - tasks if on_last else 131 if q_inline else 0)
    # (not at TP4 up to 4 rows: measured faster without, DeepSeek sessions 37-38)
    prefetch = on_last and not (tp == 4 and tokens <= 4)
    assert st["wq_b"].values["l2_prefetch_at"] == ("qkv" if prefetch else None)
    text = render(ir)
    assert f"constexpr int QKV_PARTS = {k_parts};" in text
    if quarters:
        wqkv = text[text.index("namespace stage_wqkv_a {"):text.index("}  // namespace stage_wqkv_a")]
        assert "mx_gemv64_wgmma<WGMMA_DEPTH, CPWG, GROUPS, NG, SSTRIDE, SWIZZLE>(" in wqkv and "constexpr int WGMMA_DEPTH = 3;" in wqkv and "(long long)unit_part(u) * NC * 16 * GEMV_K_CHUNK" in wqkv
        rows = wqkv[wqkv.index("MONO_DEVICE void stage_rows("):wqkv.index("MONO_DEVICE void run(")]
        if tokens <= 9:  # x quantized here, straight into core matrices
            assert "xl[item_word(r, it)] = w0;" in rows and "await_rows(" not in wqkv
            assert "constexpr bool SWIZZLE = false;" in wqkv
        elif tokens == 16:  # copied from xq's X8 into the swizzled layout, the codes by cp.async
            assert "await_rows(mb, kpart);" in wqkv and "constexpr bool SWIZZLE = true;" in wqkv
            assert rows.index("copy16_async(xs + ") < rows.index("xl + row_word(i / VECS, i % VECS)) = x;") \
                < rows.index("copy_async_wait();")
        else:  # xq stored X8 as this LDS image (spec X8_IMAGE): the K part's stretch by one bulk copy
            assert "await_rows(mb, kpart);" in wqkv and "constexpr bool SWIZZLE = true;" in wqkv
            assert "bulk_copy(xl, mb.x8 + swizzle128_word<IMAGE_GROUPS>(0, part * VECS), NG * 8 * KP, rbar);" in rows
            assert "copy16_async(xl + " not in rows and "xl + row_word(i / VECS, i % VECS)) = x;" not in rows
        assert ("fence_proxy_async_lds();" in rows) is (tokens <= 16)  # generic-proxy stores, read by the wgmma
        assert "if (QKV_PARTS == 4) sum = sum + (u32_as_float(pk[2][e]) + u32_as_float(pk[3][e]));" in text


@pytest.mark.parametrize("stage,tokens", [("wqkv_a", 16), ("wqkv_a", 48), ("wq_b", 1), ("wq_b", 48)])
def test_gemv_probe_points(stage, tokens):
    """rows_point / unit_point stamp the spare points where asked (the wgmma and mma.sync run()
    forms), nowhere else."""
    plain = render(ir_of(tokens=tokens, timeline=True))
    assert "stamp(lds, TL_SPARE" not in plain and "constexpr int TL_SPARE2 = 7;" in plain
    text = render(ir_of(tokens=tokens, timeline=True, tune={f"{stage}.rows_point": "spare", f"{stage}.unit_point": "spare2"}))
    ns = text[text.index(f"namespace stage_{stage} {{"):text.index(f"}}  // namespace stage_{stage}")]
    assert ns.count("stamp(lds, TL_SPARE);") == 1 and ns.count("stamp(lds, TL_SPARE2);") == 1
    assert ns.index("stage_rows(a, mb,", ns.index("MONO_DEVICE void run(")) < ns.index("stamp(lds, TL_SPARE);")
    with pytest.raises(SpecError, match="no timeline point 'nowhere'"):
        ir_of(tokens=tokens, tune={f"{stage}.rows_point": "nowhere"})
    # flags_point: between the wait for the rows' flags and their copy; refused where the CTA
    # computes its rows itself (wq_b at 1 row at TP2 norms q inline)
    tune = {f"{stage}.flags_point": "spare4"}
    if (stage, tokens) == ("wq_b", 1):
        with pytest.raises(SpecError, match="flags_point stamps the wait for the source's flags"):
            ir_of(tokens=tokens, tp=2, timeline=True, tune=tune)
    run = render(ir_of(tokens=tokens, timeline=True, tune=tune))
    run = run[run.index(f"namespace stage_{stage} {{"):run.index(f"}}  // namespace stage_{stage}")]
    run = run[run.index("MONO_DEVICE void run("):]
    assert run.count("stamp(lds, TL_SPARE4);") == 1
    assert run.index("await_rows(mb,") < run.index("stamp(lds, TL_SPARE4);") < run.index("stage_rows(a, mb,")
    # mma_point (wgmma builds; wqkv at TP2 runs the mma.sync loop): after the first pass's MMAs,
    # before its epilogue's barrier
    tune = {f"{stage}.mma_point": "spare3"}
    if stage == "wqkv_a":
        with pytest.raises(SpecError, match="mma_point stamps the wgmma loop's first pass"):
            ir_of(tokens=tokens, tp=2, timeline=True, tune=tune)
    text = render(ir_of(tokens=tokens, timeline=True, tune=tune))
    ns = text[text.index(f"namespace stage_{stage} {{"):text.index(f"}}  // namespace stage_{stage}")]
    run = ns[ns.index("MONO_DEVICE void run("):]
    assert run.index("mx_gemv64_wgmma<") < run.index("if (i0 == 0 && c0 == 0) stamp(lds, TL_SPARE3);") \
        < run.index("epilogue_passes(" if tokens > 16 else "epilogue_group(")


@pytest.mark.parametrize("depth", [3, 4])
def test_wgmma_depth(depth):
    """wgmma_depth sets the chunks a warp keeps in flight, per stage: its loop's template argument
    and the device function's ring of d registers; outside 2..4 refused; no effect on mma.sync loops."""
    text = render(ir_of(tokens=16, tune={"wq_b.wgmma_depth": depth, "wqkv_a.wgmma_depth": 2}))
    ns = {st: text[text.index(f"namespace stage_{st} {{"):text.index(f"}}  // namespace stage_{st}")] for st in ("wqkv_a", "wq_b")}
    assert f"constexpr int WGMMA_DEPTH = {depth};" in ns["wq_b"] and "constexpr int WGMMA_DEPTH = 2;" in ns["wqkv_a"]
    assert "float d[DEPTH][4 * J];" in text and "wgmma_wait<DEPTH - 1>();" in text
    for bad in (1, 5):
        with pytest.raises(SpecError, match=f"stages.4.wgmma_depth: .*] {bad} chunks in flight: 2, 3 or 4"):
            ir_of(tokens=16, tune={"wq_b.wgmma_depth": bad})
    # the mma.sync loops (wqkv at TP2) take no depth: the same source as the spec's
    tuned = render(ir_of(tokens=16, tp=2, tune={"wqkv_a.wgmma_depth": depth}))
    assert tuned.replace(f"// tune:   wqkv_a.wgmma_depth={depth}  (overrides of the spec's knobs)\n", "") == render(ir_of(tokens=16, tp=2))


def test_wq_b_weights_point():
    """weights_point stamps right after the bulk weights' mbarrier wait (bulk builds only)."""
    text = render(ir_of(tokens=1, timeline=True, tune={"wq_b.weights_point": "spare", "wq_b.bulk_weights": {"default": 0, "sm90": 1},
                                                         "wq_b.wgmma": 0}))
    ns = text[text.index("namespace stage_wq_b {"):text.index("}  // namespace stage_wq_b")]
    wait = ns.index("bulk_wait(reinterpret_cast<u64*>(lds + LDS_WBAR), 0, mb.tag);")
    assert ns.count("stamp(lds, TL_SPARE);") == 1 and wait < ns.index("stamp(lds, TL_SPARE);") < ns.index("mx_gemv16_units<")


def test_q_inline_builds():
    """Up to INLINE_Q_TOKENS rows wq_b norms q itself from the partials (no QX8 wait) and the
    qkv stage publishes nothing, on the last CTA, which has no wq_b unit (sm90); above, QX8 and
    its flags as before. Both emit the one q latent math (mla_q_math). The emulated MMAs' loop (TP2's;
    test_wqb_wgmma_layout has the wgmma loop's rows)."""
    # q_inline up to 2 rows: TP2's spec (TP4's has none); above, QX8 by flags (not tagged pairs)
    emulated = {"wq_b.wgmma": 0, "symbols.INLINE_Q_TOKENS": 2, "symbols.QX8_TAGGED": 0}
    for tokens, inline in ((1, True), (6, False)):
        ir = ir_of(tokens=tokens, tune=emulated)
        qkv, wqb = (next(s for s in ir.stages if s.name == n) for n in ("qkv", "wq_b"))
        assert wqb.values["q_inline"] is inline and qkv.values["publish"] is not inline
        # S = 6 (K quarters): two tokens a task on the last 3 CTAs, which have no wqkv nor wq_b unit
        assert qkv.first == (131 if inline else 129) and wqb.ctas == (131 if inline else 128)
        text = render(ir)
        ns = text[text.index("namespace stage_wq_b {"):text.index("}  // namespace stage_wq_b")]
        assert ("await_rows(" in ns) is not inline
        assert ("sum_partials<LDS_TOKENS * Q_RANK, LDS_TOKENS>(mb.qkvp, mb.tag, tok0, vals);" in ns) is inline
        assert f"constexpr bool PUBLISH = {'false' if inline else 'true'};" in text
        run = ns[ns.index("MONO_DEVICE void run("):]
        if inline:  # nothing ahead of the partials' wait waits on memory: cos / sin behind it (bulk too)
            order = ["const long long cs_pos = a.pos[csi / ROPE];", "stage_rows(a, mb, lds, ",
                     "cs_val = cos_sin_value(a, cs_pos, csi);", "mx_gemv16_units<GROUP", "[thread_id()] = cs_val;", "epilogue_group("]
            bulk = render(ir_of(tokens=tokens, tune=emulated | {"wq_b.bulk_weights": {"default": 0, "sm90": 1}}))
            bulk = bulk[bulk.index("namespace stage_wq_b {"):bulk.index("}  // namespace stage_wq_b")]
            for r in (run, bulk[bulk.index("MONO_DEVICE void run("):]):
                assert [r.index(o) for o in order] == sorted(r.index(o) for o in order) and "stage_cos_sin(a," not in r
        else:
            assert run.index("stage_cos_sin(a,") < run.index("await_rows(mb, ")
        assert "u32 sw[SLOTS][CODE_WORDS];" in run and "unpack_scales(sw[i0 + uu], swg[uu]);" in run  # codes kept packed
        assert text.count("MONO_DEVICE int q_quant(") == 1 + inline
    assert {b.name for b in ir_of(tokens=1, tune={"symbols.INLINE_Q_TOKENS": 6}).lds if b.stage == "wq_b"} >= {"qv", "qred"}


@pytest.mark.parametrize("tune,field,message", [
    ({"wqkv_a.q_inline": True}, "stages.2.q_inline", "only an mla_norm_rope source's q latent"),
    ({"qkv.publish": False}, "stages.4.x_from", "does not publish QX8 in this build"),
])
def test_q_inline_refusals(tune, field, message):
    with pytest.raises(SpecError, match=message) as e:
        ir_of(tokens=6, tune=tune)
    assert field in str(e.value)


def test_qkv_probe_points():
    """got_point / summed_point / norms_point / quant_point stamp the qkv stage's first token: after
    thread 0's partials' wait and sums, after every thread's, after the sums of squares, after its
    QX8 stores (before the flag)."""
    text = render(ir_of(tokens=16, timeline=True, tune={"qkv.got_point": "spare", "qkv.quant_point": "spare2"}))
    ns = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
    got, quant = ns.index("stamp(lds, TL_SPARE);"), ns.index("stamp(lds, TL_SPARE2);")
    assert ns.index("sum_partials<QKV * TOKENS_PER_TASK, TOKENS_PER_TASK>(mb.qkvp, mb.tag, t0, vals_all);") < got \
        < ns.index("st8(mb.qx8") < quant < ns.index("publish(mb, t0);")
    assert "stamp(lds, TL_SPARE" not in render(ir_of(tokens=16, timeline=True)).split("namespace stage_qkv {")[1]
    # summed_point: after the barrier that ends every thread's wait, before the sums of squares
    text = render(ir_of(tokens=16, timeline=True, tune={"qkv.summed_point": "spare"}))
    ns = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
    at = ns.index("stamp(lds, TL_SPARE);")
    assert ns.rindex("barrier();", 0, at) > ns.index("sum_partials<QKV * TOKENS_PER_TASK,") and at < ns.index("q_group_sumsq(xq)")
    # norms_point: after the barrier that brings every group's sums of squares in, before q's quant
    text = render(ir_of(tokens=16, timeline=True, tune={"qkv.norms_point": "spare"}))
    ns = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
    at = ns.index("stamp(lds, TL_SPARE);")
    assert ns.index("red[RED_KV + tt / 32] = ssk;") < ns.rindex("barrier();", 0, at) and at < ns.index("q_rsq(red + RED_Q)") \
        < ns.index("q_quant(xq, rq, qw, ys, w0, w1)")


@pytest.mark.parametrize("target", list(TARGETS))
def test_qkv_uses_nothing_it_loads_before_the_partials_wait(target):
    """The qkv stage issues its small loads (qn_w, kvn_w, pos, slot) before the partials' wait
    but uses them only after it: their conversion goes through opaque(), and the cos / sin row
    (whose address needs pos) is read after the wait. On sm90 a use before the wait held the
    first poll for three serial round trips (bench/NOTES.md, DeepSeek session 10)."""
    text = render(ir_of(target, tokens=16))
    ns = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
    token = ns[ns.index("MONO_DEVICE void token("):]
    token = token[:token.index("\n}\n")]
    before, after = token.split("sum_partials<", 1)
    for raw in ("qw_raw[j] = ", "kw_raw = ", "pos64 = ", "slot64 = "):
        assert raw in before
    assert "bf16_to_f32" not in before and "cos_sin" not in before and "int(pos64)" not in before
    assert "opaque(qw_raw[j])" in after and "opaque(kw_raw)" in after and "cos_sin" in after


@pytest.mark.parametrize("target", list(TARGETS))
def test_flag_waits_acquire_in_the_polling_threads(target):
    """wq_b's wait for QX8's flags: the polling threads acquire (mailbox_wait<true>) and the
    barrier passes it on (barrier_acquire); no CTA-wide fence, whose sm90 CCTL.IVALL would wait
    for every load in flight, the weights included. AMD's barrier_acquire keeps the fence."""
    text = render(ir_of(target, tokens=16))
    ns = text[text.index("namespace stage_wq_b {"):text.index("}  // namespace stage_wq_b")]
    wait = ns[ns.index("MONO_DEVICE void await_rows"):]
    wait = wait[:wait.index("\n}\n")]
    assert "mailbox_wait<true>(" in wait and "barrier_acquire();" in wait and "fence_acquire" not in wait
    lib = text[:text.index("namespace stage_")]
    body = lib[lib.index("MONO_DEVICE void barrier_acquire()"):]
    body = body[:body.index("}\n") + 2]
    assert ("fence_acquire();" in body) is (target != "sm90")
    assert "ld.acquire.gpu" in lib if target == "sm90" else "ld.acquire" not in lib


def test_xq_holds_every_unit_load_at_once():
    """xq issues all of a CTA's unit loads before it quantizes any (one round trip): at most 16
    units a CTA, else a located refusal naming the placement."""
    ir = ir_of(tokens=48, tune={"xq.placement_by_target": {}})  # the 20 CTAs without wqkv units (the spec's S = 48: 64)
    xq = next(s for s in ir.stages if s.name == "xq")
    assert -(-xq.tasks // xq.ctas) == 10  # 4 K quarters of 48 rows
    text = render(ir)
    ns = text[text.index("namespace stage_xq {"):text.index("}  // namespace stage_xq")]
    assert ns.index("raw[i] = ld16(") < ns.index("mx_quant8(raw[i], MX_FP8_MAX, w0, w1);")
    with pytest.raises(SpecError, match=r"192 units a CTA: a CTA holds all its units' loads at once") as e:
        ir_of(tokens=48, tune={"xq.placement_by_target": {"sm90": {"round_robin": {"first": 131}}}})
    assert "stages.0.placement" in str(e.value)


@pytest.mark.parametrize("tokens", [9, 16, 48])
def test_wqb_late_weights(tokens):
    """late_weights (off in the spec since QX8 comes by TMA): wq_b's first group of weight loads
    goes out after the token rows are in LDS instead of before the rows' wait (the wgmma loop only)."""
    for late in (0, 1):
        ir = ir_of(tokens=tokens, tune={"wq_b.late_weights": late} if late else None)
        assert next(s for s in ir.stages if s.name == "wq_b").values["late_weights"] == bool(late)
        text = render(ir)
        run = text[text.index("MONO_DEVICE void run(", text.index("namespace stage_wq_b {")):text.index("}  // namespace stage_wq_b")]
        load, wait, rows = (run.index(c) for c in ("load_group0();", "await_rows(mb, kpart);", "stage_rows(a, mb, lds, kpart"))
        assert (wait < rows < load) if late else (load < wait < rows)
        assert run.count("load_group0();") == 1
    # the mma.sync loop keeps its own load order: the knob does nothing there
    v = next(s for s in ir_of(tokens=tokens, tune={"wq_b.wgmma": 0, "wq_b.late_weights": 1}).stages if s.name == "wq_b").values
    assert not v["wgmma"] and not v["late_weights"]


def test_qx8_image_refusals():
    """qkv.image is sm90's layout: on for an AMD target, a located refusal; off at sm90 S = 48 (a
    tune), wq_b copies QX8 row-major by 16-byte loads, and the region is B.8's again."""
    with pytest.raises(SpecError, match=r"attn_front.yaml:\d+: stages\.\d+\.image: \[gfx950 .*\] the image is sm90 wgmma.s swizzled"):
        ir_of("gfx950", tokens=16, tune={"qkv.image": {"default": 1}})
    ir = ir_of(tokens=48, tune={"symbols.QX8_IMAGE": {"default": 0}})
    wqb = next(s for s in ir.stages if s.name == "wq_b").values
    assert not wqb["tma_rows"] and wqb["image_groups"] == 0 and wqb["swizzle"]
    assert "bulk_copy(xl, mb.qx8" not in render(ir)


@pytest.mark.parametrize("tokens", [6, 16, 48])
def test_image_offsets(tokens):
    """The tests' map of rows into a wgmma GEMV's LDS image (the sm90 library's swizzle128_word):
    every byte of every token a place of its own inside ceil(S / 8) 8-token groups; token t's
    128-byte K segment s is row t % 8 of atom (s, t / 8), its 16-byte chunks permuted by t % 8."""
    groups = -(-tokens // 8)
    off = dc.image_offsets(tokens, 1280, groups)
    assert off.unique().numel() == tokens * 1280 and int(off.max()) < groups * 8 * 1280
    for t in (0, tokens // 2, tokens - 1):
        for seg in (0, 3, 9):
            row = off[t, 128 * seg:128 * (seg + 1)]
            assert bool((row // 128 == (seg * groups + t // 8) * 8 + t % 8).all())
            chunks = (row % 128 // 16).view(8, 16)[:, 0]
            assert chunks.tolist() == [j ^ (t % 8) for j in range(8)]


@pytest.mark.parametrize("tokens", [10, 16, 17, 48])
def test_x8_image(tokens):
    """X8_IMAGE (the spec's at sm90 TP4 from 10 rows, not at 16): xq stores X8 as wqkv's LDS
    image, whole 8-token groups of the swizzled layout, and each wqkv CTA takes its K part's stretch of it
    (whole 128-byte segments: contiguous) with one TMA bulk copy instead of copying rows; at TP2
    (mma.sync wqkv, no swizzled rows) the rows come from the image's places by 16-byte loads.
    Elsewhere the spec's builds store X8 row-major; the image is refused on AMD."""
    on = {"symbols.X8_IMAGE": 1}
    ir = ir_of(tokens=tokens, tune=on)
    st = {s.name: s for s in ir.stages}
    groups = -(-tokens // 8)
    assert st["xq"].values["image_groups"] == groups and ir.region("x8").count == groups * 8 * 5120 // 4
    w = st["wqkv_a"].values
    assert w["image_groups"] == groups and w["tma_rows"] and not w["rows_async"] and w["swizzle"]
    text = render(ir)
    xq = text[text.index("namespace stage_xq {"):text.index("}  // namespace stage_xq")]
    assert "return mb.x8 + swizzle128_item_word<IMAGE_GROUPS>(t, part * KP / 8 + it);" in xq
    assert "st8(out_item(mb, t, part, item), w0, w1);" in xq
    wqkv = text[text.index("namespace stage_wqkv_a {"):text.index("}  // namespace stage_wqkv_a")]
    assert "bulk_copy(xl, mb.x8 + swizzle128_word<IMAGE_GROUPS>(0, part * VECS), NG * 8 * KP, rbar);" in wqkv
    assert "copy16_async(xl + " not in wqkv and "= x;" not in wqkv[wqkv.index("MONO_DEVICE void stage_rows("):]
    # part p's stretch: its first piece's place is p * NG * 8 * KP bytes in, the pieces of a part contiguous
    off = dc.image_offsets(tokens, 5120, groups)
    kp = 5120 // 4
    for p in range(4):
        part = off[:, p * kp:(p + 1) * kp]
        assert int(part.min()) == p * groups * 8 * kp and int(part.max()) < (p + 1) * groups * 8 * kp
    # TP2: halves on mma.sync, padded row-major LDS rows from the image's places
    tp2 = ir_of(tokens=tokens, tp=2, tune=on)
    w2 = next(s for s in tp2.stages if s.name == "wqkv_a").values
    assert w2["image_groups"] == groups and not w2["tma_rows"] and not w2["swizzle"]
    assert "swizzle128_word<IMAGE_GROUPS>(tok0 + i / VECS, part * VECS + i % VECS)" in render(tp2)
    for tp in (2, 4):
        spec = ir_of(tokens=tokens, tp=tp)
        image = tp == 4 and tokens != 16
        assert next(s for s in spec.stages if s.name == "xq").values["image_groups"] == groups * image
        assert spec.region("x8").count == (groups * 8 if image else tokens) * 5120 // 4
    with pytest.raises(SpecError, match=r"stages\.\d+\.image: \[gfx942 .*\] the image is sm90 wgmma.s swizzled"):
        ir_of("gfx942", tokens=tokens, tune=on)


def test_wq_b_l2_prefetch():
    """l2_prefetch: the kernel issues wq_b's prefetch_l2() (a TMA prefetch of each of the CTA's
    units' weights, the lines of its codes) right before the qkv stage runs; refused on AMD and
    without an earlier stage to start with."""
    text = render(ir_of(tokens=16))
    body = text[text.index("MONO_KERNEL"):]
    assert body.index("stage_wqkv_a::run(") < body.index("stage_wq_b::prefetch_l2(a);") < body.index("stage_qkv::run(")
    ns = text[text.index("namespace stage_wq_b {"):text.index("}  // namespace stage_wq_b")]
    assert "bulk_prefetch_l2(a.wqb + (long long)unit_row0(u) * K" in ns and "prefetch_line_l2(unit_codes(a, u));" in ns
    assert "prefetch_l2(a)" not in render(ir_of(tokens=48))  # the spec's: off where the qkv CTAs have wqkv units
    on = {"wq_b.l2_prefetch": 1}
    with pytest.raises(SpecError, match="gfx950's device library has no L2 prefetch"):
        ir_of("gfx950", tokens=16, tune=on)
    with pytest.raises(SpecError, match=r"l2_prefetch needs the earlier stage it starts with, got 'wq_b'") as e:
        ir_of(tokens=16, tune={**on, "wq_b.l2_prefetch_at": "wq_b"})
    assert "attn_front.yaml:" in str(e.value) and "name one of xq, kt, wqkv_a, qkv, launch" in str(e.value)
    # a stage the build lacks (xq below 9 rows): the next one present
    v = next(s for s in ir_of(tokens=6, tune={**on, "wq_b.l2_prefetch_at": "xq"}).stages if s.name == "wq_b").values
    assert v["l2_prefetch_at"] == "kt"
    # `launch`: before the kernel's wait for the previous launch (after it lets the next begin),
    # the Args already made, so that a CTA resident early streams its weights while it waits
    early = render(ir_of(tokens=1, tune={"wqkv_a.l2_prefetch": 1, "wqkv_a.l2_prefetch_at": "launch"}))
    body = early[early.index("MONO_KERNEL"):]
    assert (body.index("const Args a = {") < body.index("launch_dependents();") < body.index("stage_wqkv_a::prefetch_l2(a);")
            < body.index("wait_for_previous_launch();") < body.index("stage_wqkv_a::run("))
    assert "the kernel calls it before its wait for the previous launch's" in early


def test_qkv_token_pairs():
    """Two tokens a qkv task (TP4, 5 and 6 rows: on CTAs without wq_b units): threads
    256.. take the task's second token with their own red[] / vals[]; one wait for both tokens'
    partials (a second token past TOKENS re-reads the last token's, never a pair no launch
    writes); each live token's flag."""
    ir = ir_of(tokens=5, tune={"symbols.QX8_TAGGED": 0})  # QX8 by flags (tagged, the spec, takes one token a task)
    st = {s.name: s for s in ir.stages}
    assert st["wq_b"].ctas == 128 and st["qkv"].first == 129  # the last 3 CTAs: qkv, no wq_b unit
    text = render(ir)
    ns = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
    assert "constexpr int TOKENS_PER_TASK = 2;" in ns and "constexpr int TASKS = 3;" in ns
    assert "float* red = red_all + h * RED_FLOATS;" in ns and "float* vals = vals_all + h * QKV;" in ns
    red = next(b for b in ir.lds if b.qualified_name == "stage_qkv::LDS_RED")
    assert "constexpr int RED_FLOATS = 32;" in ns and red.nbytes == 2 * 32 * 4  # both tokens' red[]
    assert "const bool mine = tid < TOKENS_PER_TASK * NORM_THREADS && t0 + h < TOKENS" in ns
    assert "if (h < TOKENS_PER_TASK && t0 + h < TOKENS && c < COPIES) mailbox_put(" in ns
    assert "(NT > 1 ? min_i(t0 + r, TOKENS - 1) : t0 + r)" in ns
    lds = {b.qualified_name: b for b in ir.lds}
    assert lds["stage_qkv::LDS_RED"].nbytes == 2 * 32 * 4 and lds["stage_qkv::LDS_VALS"].nbytes == 2 * 1792 * 4
    for tokens in (4, 7, 21):  # 4 fit the free CTAs one a task; 7 pairs measured slower
        assert "constexpr int TOKENS_PER_TASK = 1;" in render(ir_of(tokens=tokens))
    assert "constexpr int TOKENS_PER_TASK = 1;" in render(ir_of(tokens=20, tp=2))


def test_rows_async():
    """rows_async: the token rows from the source's mailbox by cp.async, not through registers
    (the spec's: wqkv_a at TP4 above 16 rows, where X8_IMAGE is tuned off); wq_b's copied rows (1..15
    rows) by tune, with the fence for the wgmma after the copies landed; no effect on q_inline's
    normed rows or the TMA image copy; refused on AMD."""
    def values(stage, **kw):
        return next(s for s in ir_of(**kw).stages if s.name == stage).values
    no_image = {"symbols.X8_IMAGE": 0}
    assert [values("wqkv_a", tokens=s, tp=tp, tune=no_image)["rows_async"]
            for s, tp in ((9, 4), (16, 4), (17, 4), (48, 4), (48, 2))] == [False, False, True, True, False]
    assert not values("wqkv_a", tokens=17)["rows_async"]  # the spec's X8 image: one bulk copy
    text = render(ir_of(tokens=17, tune=no_image))
    rows = text[text.index("namespace stage_wqkv_a {"):text.index("}  // namespace stage_wqkv_a")]
    rows = rows[rows.index("MONO_DEVICE void stage_rows("):rows.index("MONO_DEVICE void run(")]
    order = ["copy16_async(xs + ", "copy16_async(xl + row_word(i / VECS, i % VECS), row_piece(i));",
             "copy_async_wait();", "fence_proxy_async_lds();", "barrier();"]
    assert [rows.index(o) for o in order] == sorted(rows.index(o) for o in order)
    assert "xl + row_word(i / VECS, i % VECS)) = x;" not in rows
    on = {"wq_b.rows_async": 1, "symbols.QX8_TAGGED": 0}  # (tagged pairs are polled, not copied: refused)
    assert [values("wq_b", tokens=s, tune=on)["rows_async"] for s in (1, 2, 6, 15, 16, 48)] \
        == [True, True, True, True, False, False]  # the image from 16
    assert not values("wq_b", tokens=1, tp=2, tune=on)["rows_async"]  # q_inline (TP2)
    text = render(ir_of(tokens=6, tune=on))
    rows = text[text.index("namespace stage_wq_b {"):text.index("}  // namespace stage_wq_b")]
    rows = rows[rows.index("MONO_DEVICE void stage_rows("):rows.index("MONO_DEVICE void await_rows(")]
    order = ["copy16_async(xl + row_word(i / VECS, i % VECS), row_piece(i));", "copy_async_wait();",
             "fence_proxy_async_lds();", "barrier();"]
    assert [rows.index(o) for o in order] == sorted(rows.index(o) for o in order)
    assert rows.count("fence_proxy_async_lds();") == 1 and "= x;" not in rows
    with pytest.raises(SpecError, match="gfx942's device library has no asynchronous global-to-LDS copy") as e:
        ir_of("gfx942", tokens=6, tune=on)
    assert "attn_front.yaml:" in str(e.value) and "rows_async" in str(e.value)


def test_tagged_qx8():
    """symbols.QX8_TAGGED: the qkv stage puts QX8 and its codes as tagged pairs (twice the words)
    and raises no QRDY flag (no fence either); wq_b polls the pairs, no flag wait and no cp.async
    of the codes. Refused beside QX8's image (sm90 TP4 S = 16), at the qkv stage's tagged line;
    and with rows_async, whose copy cannot check tags."""
    tagged = {"symbols.QX8_TAGGED": 1}
    plain, ir = ir_of(tokens=6, tune={"symbols.QX8_TAGGED": 0}), ir_of(tokens=6, tune=tagged)
    assert [r.name for r in ir.regions] == [r.name for r in plain.regions]
    for name in ("qx8", "qx8s"):
        assert ir.region(name).count == 2 * plain.region(name).count
    text = render(ir)
    assert "constexpr bool TAGGED = true;" in text and "constexpr bool TAGGED = false;" in render(plain)
    assert "mailbox_put2(reinterpret_cast<u64*>(mb.qx8) + qx8_word(t, tt), w0, w1, mb.tag);" in text
    assert "MONO_DEVICE void await_rows(const Mailbox&, int) {}" in text
    assert "copy16_async(xs" not in text and "copy16_async(xs" in render(plain)
    line = next(i for i, t in enumerate(TEXT.splitlines(), 1) if t.strip() == "tagged: QX8_TAGGED")
    with pytest.raises(SpecError, match=rf"attn_front\.yaml:{line}: .*tagged.*two layouts of QX8"):
        ir_of(tokens=16, tune=tagged)
    with pytest.raises(SpecError, match="rows_async.*tagged pairs"):
        ir_of(tokens=6, tune={**tagged, "wq_b.rows_async": {"default": 0, "sm90": 1}})
    # wq_b pending_polls: a poll round loads only this thread's pieces not yet tagged (the debug
    # build's bounded twin in the kernel's preamble); no effect where the rows are not tagged pairs
    pending = {**tagged, "wq_b.pending_polls": 1}
    call = "mailbox_wait_pending2(pair, 2 * min_i(ROW_BATCH, (n - 1 - b) / THREADS + 1), mb.tag, got);"
    assert call in render(ir_of(tokens=6, tune=pending)) and call not in text
    assert "const Tag& tag, u32 (&value)[N][2]" in render(ir_of(tokens=6, debug=True, tune=pending))
    assert not next(s for s in ir_of(tokens=16, tune={"wq_b.pending_polls": 1}).stages if s.name == "wq_b").values["pending_polls"]
    # symbols.QX8_COPIES (the qkv stage's tagged_copies): every copy stored, CTA c of wq_b polls
    # copy c % copies; no effect untagged
    three = ir_of(tokens=6, tune={**tagged, "symbols.QX8_COPIES": 3})
    assert three.region("qx8").count == 3 * ir.region("qx8").count and three.region("qx8s").count == 3 * ir.region("qx8s").count
    t3 = render(three)
    assert "constexpr int TAGGED_COPIES = 3, COPY_PAIRS = 1920, COPY_CODE_PAIRS = 240;" in t3
    assert "mailbox_put2(reinterpret_cast<u64*>(mb.qx8) + c * COPY_PAIRS + qx8_word(t, tt), w0, w1, mb.tag);" in t3
    assert "constexpr int SRC_COPIES = 3, SRC_COPY_PAIRS = 1920, SRC_COPY_CODE_PAIRS = 240;" in t3
    assert "const int copy = block_id() % SRC_COPIES;" in t3 and "SRC_COPIES" not in text
    untagged = ir_of(tokens=6, tune={"symbols.QX8_TAGGED": 0, "symbols.QX8_COPIES": 3})
    assert untagged.region("qx8").count == plain.region("qx8").count and "COPY_PAIRS" not in render(untagged)
    # wq_b poll_sleep: ns between a thread's poll rounds (0: the target's pause()), both waits and
    # the debug twins take it; no effect on untagged rows; a nap past 10 us refused
    assert "mailbox_wait_all2(pair, mb.tag, got);" in text
    assert "mailbox_wait_all2<256>(pair, mb.tag, got);" in render(ir_of(tokens=6, tune={**tagged, "wq_b.poll_sleep": 256}))
    slept = render(ir_of(tokens=6, debug=True, tune={**pending, "wq_b.poll_sleep": 300}))
    assert call.replace("2(pair", "2<300>(pair") in slept and "template <int SLEEP_NS = 0, int N>" in slept
    assert "<256>(pair" not in render(ir_of(tokens=16, tune={"wq_b.poll_sleep": 256}))
    with pytest.raises(SpecError, match="poll_sleep.*at most 10000"):
        ir_of(tokens=6, tune={**tagged, "wq_b.poll_sleep": 20000})


@pytest.mark.parametrize("target", TARGETS)
def test_qx8_copies(target):
    """QX8_COPIES (the qkv stage's tagged_copies): sm90 stores the tagged QX8 twice where that was
    measured faster with the split pinned (bench/NOTES.md DeepSeek sessions 41-42): TP4 at 7..10
    rows, TP2 at 3 / 5 / 11; once elsewhere and on AMD. wq_b's CTAs poll copy c % 2 there."""
    loaded = load_spec("deepseek_v41/attn_front")
    for tp in (2, 4):
        for tokens in range(1, 49):
            ir = lower(loaded, make_build(loaded, target, tokens=tokens, tp=tp))
            qkv = next(st for st in ir.stages if st.kind == "mla_norm_rope")
            twice = {4: range(7, 11), 2: (3, 5, 11)}[tp]
            want = 2 if target == "sm90" and tokens in twice else 1
            assert qkv.values["tagged_copies"] == want, (target, tp, tokens)
            if want == 2:
                assert qkv.values["tagged"] and "const int copy = block_id() % SRC_COPIES;" in render(ir)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("tp", [2, 4])
def test_smem_carveout(target, tp):
    """grid.smem_carveout (SMEM_CARVEOUT): sm90 TP4 prefers all shared memory at the rows where
    that was measured faster (TP4 1..3 and 12..23, TP2 9..15), the most L1 elsewhere (0); AMD
    leaves it to the driver (-1). The sm90 header says which."""
    loaded = load_spec("deepseek_v41/attn_front")
    for tokens in range(1, 49):
        ir = lower(loaded, make_build(loaded, target, tokens=tokens, tp=tp))
        if target != "sm90":
            want = -1
        else:
            want = 100 if tokens in {4: [*range(1, 4), *range(12, 24)], 2: range(9, 16)}[tp] else 0
        assert ir.smem_carveout == want, (target, tp, tokens)
    ir = lower(loaded, make_build(loaded, target, tokens=16, tp=tp))
    line = f"// L1 / shared memory: {ir.smem_carveout} % as shared memory preferred"
    assert (line in render(ir)) is (target == "sm90")
