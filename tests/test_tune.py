"""Tuning overrides (``tune``): a stage field of a spec replaced for one build
without editing the file, checked like the file's own values, named in the
generated header, and kept apart from the untuned build in every cache."""

from __future__ import annotations

import pytest

from codegen.__main__ import main
from codegen import jit
from codegen.errors import SpecError
from codegen.launch import load
from codegen.lower import lower, make_build
from codegen.render import source
from codegen.spec import load_spec, parse_spec, tune_items
from codegen.spec.load import spec_path
from codegen.targets import get_target
from tests.minimax_case import CUDA_CORES, ROWS_FIRST

SPEC = "minimax_m3/pre_attn"
BULK_CALL = "stage_weights_bulk(a, lo"  # the sm90 GEMV's bulk-copy issue (bulk_copies on)


def test_override_changes_the_build_and_names_itself():
    _, plain = source(SPEC, "sm90", tokens=4)
    _, tuned = source(SPEC, "sm90", tune={"qkv.bulk_copies": 1}, tokens=4)
    assert BULK_CALL in tuned and BULK_CALL not in plain  # the spec leaves bulk copies off at S = 4
    assert "// tune:" not in plain
    assert "// tune:   qkv.bulk_copies=1  (overrides of the spec's knobs)" in tuned.splitlines()[3]
    # everything else is the same kernel: one knob, one difference in the header
    assert plain.splitlines()[:3] == tuned.splitlines()[:3]


def test_per_target_mapping_override():
    _, tuned = source(SPEC, "sm90", tune={"qkv.bulk_copies": {"default": 0, "sm90": 1}}, tokens=4)
    _, plain = source(SPEC, "sm90", tokens=4)
    assert BULK_CALL in tuned and BULK_CALL not in plain  # the spec leaves them off at S = 4
    assert "qkv.bulk_copies={default: 0, sm90: 1}" in tuned


def test_list_override_names_itself():
    _, tuned = source(SPEC, "sm90", tune={"qkv.rows_first_range": ["IQ_OFF", "HEAD_DIM"]}, tokens=1)
    assert "// tune:   qkv.rows_first_range=[IQ_OFF, HEAD_DIM]  (overrides of the spec's knobs)" in tuned.splitlines()[3]


def test_the_untuned_spec_is_not_touched():
    tuned = load_spec(SPEC, tune_items({"qkv.bulk_copies": 0}))
    plain = load_spec(SPEC)
    assert tuned is not plain and tuned.tune and not plain.tune
    qkv = next(s for s in plain.spec.stages if s.name == "qkv")
    assert qkv.bulk_copies.for_target("sm90") != 0


def test_loaded_kernels_are_cached_apart():
    a = load(SPEC, tokens=4, target="sm90")
    b = load(SPEC, tokens=4, target="sm90", tune={"qkv.bulk_copies": 1})
    c = load(SPEC, tokens=4, target="sm90", tune={"qkv.bulk_copies": 1})
    assert a is not b and b is c
    assert BULK_CALL in b.source and BULK_CALL not in a.source


@pytest.mark.parametrize("tune, line, fragment", [
    ({"nope.x": 1}, "stages", "no stage 'nope'"),
    ({"qkv": 1}, "stages", "is not STAGE.FIELD"),
    ({"qkv.a.b": 1}, "stages", "is not STAGE.FIELD"),
    ({"qkv.no_such_field": 1}, "qkv", "Extra inputs are not permitted"),
    ({"qkv.bulk_copies": 2}, "bulk_copies", "must be true / false or 1 / 0"),
    ({"qkv.lds_prefetch": 0}, "bulk_copies", "bulk_copies is how lds_prefetch moves"),  # the knob that needs it
    ({"qkv.bulk_copies": 0}, "rotate_copies", "rotate_copies splits the staged segments' bulk copies"),
    ({"symbols.NO_SUCH": 1}, "symbols", "no symbol 'NO_SUCH'"),
])
def test_bad_overrides_are_located_errors(tune, line, fragment):
    with pytest.raises(SpecError) as e:
        source(SPEC, "sm90", tune=tune, tokens=1)
    text = str(e.value)
    assert text.startswith("specs/minimax_m3/pre_attn.yaml:") and fragment in text, text
    where = int(text.split(":")[1])
    spec_lines = load_spec(SPEC).text.splitlines()
    if line in ("stages", "symbols"):
        assert spec_lines[where - 1].startswith(f"{line}:")
    elif line == "qkv":
        assert spec_lines[where - 1].strip() == "- name: qkv"
    else:  # the error points at the knob's own line in the file
        assert spec_lines[where - 1].strip().startswith(f"{line}:"), spec_lines[where - 1]


def test_gemv_segment_waits():
    """qkv.segment_waits (sm90, the spec's at S = 1): each staged weight segment is waited for
    just before its MMAs, in processing order: with bulk copies (the spec's S <= 2 and >= 8) one
    mbarrier a segment (three in LDS, each initialized, told its bytes and invalidated by thread
    0); with cp.async (S = 3..7) a commit group a segment and a wait that leaves the later ones in
    flight. Off, the builds wait once for all. Every build compiles without spills; refused
    without lds_prefetch. The GPU test compares its qkv with the spec build's bit for bit."""
    for tokens, on in ((1, True), (2, False), (16, False)):  # the spec's
        ir, _ = source(SPEC, "sm90", tokens=tokens)
        assert [s.values["segment_waits"] for s in ir.stages if s.name == "qkv"] == [on]
    for tokens, bulk in ((1, True), (4, False), (16, True)):
        _, plain = source(SPEC, "sm90", tune={"qkv.segment_waits": 0}, tokens=tokens)
        _, tuned = source(SPEC, "sm90", tune={"qkv.segment_waits": 1}, tokens=tokens)
        gemv = tuned[tuned.index("namespace stage_qkv {"):tuned.index("}  // namespace stage_qkv")]
        loop = gemv[gemv.index("for (int g = g_last; g >= g_first; --g) {"):]
        assert "const int n_staged = staged_segments(lo, hi, g_reg);" in gemv
        if bulk:
            assert "bulk_wait(wbar, 0, mb.tag);" in plain and "bulk_wait(wbar, 0, mb.tag);" not in gemv
            assert "bulk_wait(wbar + staged, 0, mb.tag);" in loop and "++bar;  // the next segment's" in gemv
            assert "bulk_expect(bar, segment_bytes(sg));" in gemv  # each its own bytes
            assert "constexpr int LDS_WBAR" in tuned and "stage_qkv::LDS_WBAR    @" in tuned
            assert [l for l in tuned.splitlines() if "stage_qkv::LDS_WBAR" in l][0].endswith("3 x u64")
            assert "for (int i = 0; i < n_staged; ++i) bulk_barrier_inval(wbar + i);" in gemv
        else:
            assert "copy_async_wait();  // this lane's staged chunks have landed" in plain
            assert "copy_async_wait();" not in gemv and "wait_staged_segment(staged, n_staged);" in loop
            assert gemv.count("copy_async_commit();") == 1  # in stage_weights, after each segment's copies
        (report,) = jit.resource_report(tuned, "segment_waits.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    with pytest.raises(SpecError, match="segment_waits waits for the segments lds_prefetch stages"):
        source(SPEC, "sm90", tune={"qkv.segment_waits": 1, "qkv.lds_prefetch": 0, "qkv.bulk_copies": 0}, tokens=4)


def test_gemv_rotate_copies():
    """qkv.rotate_copies (sm90, with bulk copies; the spec's up to 2 rows): each staged segment's
    bulk copy in two, from a CTA-dependent chunk r on, then its first r chunks, onto the same
    mbarrier and the same LDS places; no spill; refused without bulk copies. The GPU case
    'unrotated' compares the unrotated build's qkv with the reference as the spec's is."""
    for tokens in (1, 2, 16):
        ir, text = source(SPEC, "sm90", tune={"qkv.rotate_copies": 1}, tokens=tokens)
        assert [s.values["rotate_copies"] for s in ir.stages if s.name == "qkv"] == [True]
        gemv = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
        assert "const int len = sg.k1 - sg.k0, r = len * (3 * block_id() % 8) / 8;" in gemv
        assert "bulk_copy(wl + (slot + r) * CHUNK_WORDS, segment_weights(a, upper), segment_bytes(upper), bar);" in gemv
        assert "if (r > 0) bulk_copy(wl + slot * CHUNK_WORDS, segment_weights(a, lower), segment_bytes(lower), bar);" in gemv
        (report,) = jit.resource_report(text, "rotate_copies.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    _, plain = source(SPEC, "sm90", tune={"qkv.rotate_copies": 0}, tokens=1)
    assert "segment_weights(a, upper)" not in plain
    with pytest.raises(SpecError, match="turn bulk_copies on for this target, or rotate_copies off"):
        source(SPEC, "sm90", tune={"qkv.rotate_copies": 1, "qkv.bulk_copies": 0}, tokens=1)
    with pytest.raises(SpecError, match="rotate_copies splits"):  # S = 4: the spec copies no segment in bulk
        source(SPEC, "sm90", tune={"qkv.rotate_copies": 1}, tokens=4)


def test_gemv_tail_read_ahead():
    """qkv.tail_read_ahead (sm90 stream-K, the spec's there): the threads that finish a CTA's tail
    group load its lower piece right after they put the iteration before it (the head piece, or a
    whole group), so its round trip overlaps the tail's MMAs; the tail adds it when its tag is
    this launch's and waits for the pair as before otherwise. Same sums in the same order; the
    builds compile without spills; refused without stream-K (gfx942's GEMV)."""
    ahead = "mailbox_load(mb.qkv_part + ((g - 1) * 16 + r) * 16 + c, ahead_value, ahead_tag);"
    use = "tot = u32_as_float(ahead_tag == mb.tag ? ahead_value : mailbox_wait(piece, mb.tag)) + tot;"
    for tokens in (1, 16):
        _, plain = source(SPEC, "sm90", tune={"qkv.tail_read_ahead": 0}, tokens=tokens)
        assert ahead not in plain and "ahead_tag" not in plain
        _, spec = source(SPEC, "sm90", tokens=tokens)
        _, tuned = source(SPEC, "sm90", tune={"qkv.tail_read_ahead": 1}, tokens=tokens)
        assert spec == tuned.replace("// tune:   qkv.tail_read_ahead=1  (overrides of the spec's knobs)\n", "")  # sm90 spec value
        gemv = tuned[tuned.index("namespace stage_qkv {"):tuned.index("}  // namespace stage_qkv")]
        loop = gemv[gemv.index("for (int g = g_last; g >= g_first; --g) {"):]
        assert "u32 ahead_value = 0, ahead_tag = 0;" in gemv and loop.count(ahead) == 1 and loop.count(use) == 1
        assert "if (g - 1 == g_first && lo % NCHUNK)" in loop
        assert loop.index("mailbox_put(piece, float_as_u32(tot), mb.tag);") < loop.index(ahead)
        (report,) = jit.resource_report(tuned, "read_ahead.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    with pytest.raises(SpecError, match="tail_read_ahead reads a stream-K CTA's lower piece ahead"):
        source(SPEC, "gfx942", tune={"qkv.tail_read_ahead": 1}, tokens=1)


def test_gemv_l2_prefetch_at_launch():
    """qkv.l2_prefetch (sm90 stream-K; off in the spec), l2_prefetch_at launch: thread 0 asks L2
    for each of the CTA's segments before the kernel's wait for the previous launch, the very
    bytes its weight copies move (the same address and size as stage_weights_bulk's copy a
    segment); S = 1 / 16 compile without spills. Refused at a stage (the one place this kind
    takes is launch), on AMD, and without stream-K."""
    on = {"qkv.l2_prefetch": {"default": 0, "sm90": 1}, "qkv.l2_prefetch_at": "launch"}
    seg, size = "segment_weights(a, sg)", "segment_bytes(sg)"
    for tokens in (1, 16):
        _, text = source(SPEC, "sm90", tune=on, tokens=tokens)
        body = text[text.index("MONO_KERNEL"):]
        assert (body.index("launch_dependents();") < body.index("stage_qkv::prefetch_l2(a);")
                < body.index("wait_for_previous_launch();"))
        gemv = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
        assert f"bulk_prefetch_l2({seg}, {size});" in gemv
        assert "return a.w_qkv + task_row0(sg.g) * K + sg.k0 * 16 * GEMV_K_CHUNK;" in gemv  # the segment's bytes
        (report,) = jit.resource_report(text, "l2_prefetch.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    _, bulk = source(SPEC, "sm90", tune={"qkv.rotate_copies": 0}, tokens=1)  # bulk copies at S = 1: the same bytes a segment
    assert f"bulk_copy(wl + slot * CHUNK_WORDS, {seg}, {size}, bar);" in bulk
    assert "stage_qkv::prefetch_l2(a);" not in bulk and "MONO_DEVICE void prefetch_l2" not in bulk
    with pytest.raises(SpecError, match="prefetches before the wait for the previous launch only, got 'norm'"):
        source(SPEC, "sm90", tune={**on, "qkv.l2_prefetch_at": "norm"}, tokens=1)
    with pytest.raises(SpecError, match="gfx942's device library has no L2 prefetch"):
        source(SPEC, "gfx942", tune={"qkv.l2_prefetch": 1, "qkv.l2_prefetch_at": "launch"}, tokens=1)


def test_gemv_rows_first():
    """qkv.rows_first (sm90 with the inline norm; the spec's with one index head, rows_first_range the own
    index-q head): those 128 rows leave the stream-K units (152 row groups, the ranges without
    them) and CTAs 0..63 compute two each, rows p and p + 8 of a group. The rendered addresses,
    applied to a preshuffled random weight (codegen.weights) and random fp8 rows, give each row's
    exact dot, every row of the range once; the loads go out before the CTA's weight share, the
    dots after the inline norm and before the GEMV's waits; S = 1 / 2 compile without spills.
    Refused on AMD, with the norm stage (S > 2), and for a range that is not a row range."""
    import numpy as np
    import torch
    from codegen.weights import preshuffle

    for tokens in (1, 2):
        ir, text = source(SPEC, "sm90", tune=ROWS_FIRST, tokens=tokens)
        qkv = next(st for st in ir.stages if st.name == "qkv")
        assert qkv.values["rows_first"] == (2304, 128) and qkv.values["tasks"] == 152
        gemv = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
        for line in ("constexpr int PAIR_RANGE0 = 2304, PAIR_RANGE_ROWS = 128;", "constexpr int RANGE_FIRST[N_RANGES] = {0, 152};",
                     "constexpr int RANGE_GROUPS[N_RANGES] = {144, 8};",
                     "constexpr int UNITS = 152 * NCHUNK;"):
            assert line in gemv
        run = gemv[gemv.index("MONO_DEVICE void run("):]
        order = ["norm_load(a, tk, in[tk]);", "load_row_pair(a, t0, rp);", "stage_weights_bulk(a, lo", "norm_quant_row(a, tk",
                 "row_pair_dots(mb, t0, rp, x8, xs, reinterpret_cast<float*>(lds + LDS_PAIR_SUMS));",
                 "stage_scores::prefetch_first_keys(a);", "bulk_wait(wbar"]
        assert [run.index(o) for o in order] == sorted(run.index(o) for o in order)
        (report,) = jit.resource_report(text, "rows_first.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    # the template's addressing (asserted verbatim), applied on the host
    for line in ("MONO_DEVICE int pair_row_of(int t0) { return PAIR_RANGE0 + 16 * (t0 / 8) + t0 % 8; }",
                 "const u8* pair = a.w_qkv + (row / 16) * 16 * K + (row % 16) * 64;",
                 "rp.w[i] = ld16(pair + (pc / 4) * 16 * GEMV_K_CHUNK + (pc % 4) * 16);",
                 "const u32* xr = x8 + tk * X8_STRIDE + 8 * (pc / 4) + pc % 4;",
                 "acc[0][tk] = acc[0][tk] + w[0][e] * lo[e];", "acc[1][tk] = acc[1][tk] + w[1][e] * lo[e];",
                 "acc[0][tk] = acc[0][tk] + w[2][e] * hi[e];", "acc[1][tk] = acc[1][tk] + w[3][e] * hi[e];",
                 "mailbox_put(mb.qkv + tk * ROWS + pair_row_of(t0) + 8 * m, float_as_u32(val), mb.tag);"):
        assert line in text, line
    rows, K, first, count = 2560, 6144, 2304, 128
    gen = torch.Generator().manual_seed(5)
    w = (torch.randn(rows, K, generator=gen) * 8).to(torch.float8_e4m3fn)
    flat = preshuffle(w, "sm90").contiguous().view(torch.uint8).flatten().numpy()
    wf = w.float().numpy().astype(np.float64)
    x = (torch.randn(2, K, generator=gen) * 8).to(torch.float8_e4m3fn)
    xb = x.view(torch.uint8).numpy()
    decode = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    seen = []
    for t0 in range(count // 2):
        row = first + 16 * (t0 // 8) + t0 % 8
        pair = (row // 16) * 16 * K + (row % 16) * 64
        acc = np.zeros((2, 2))
        for pc in range(K // 32 * 4):
            piece = flat[pair + (pc // 4) * 16 * 32 + (pc % 4) * 16:][:16]
            for tk in range(2):
                word = 8 * (pc // 4) + pc % 4  # x8's word: bytes 4 word .. + 3
                lo, hi = xb[tk, 4 * word:4 * word + 4], xb[tk, 4 * (word + 4):4 * (word + 4) + 4]
                for reg, xs in ((0, lo), (1, lo), (2, hi), (3, hi)):
                    acc[reg % 2, tk] += (decode[piece[4 * reg:4 * reg + 4]] * decode[xs]).sum()
        for m in range(2):
            exact = wf[row + 8 * m] @ x.float().numpy().astype(np.float64).T
            assert np.array_equal(acc[m], exact), (t0, m)
            seen.append(row + 8 * m)
    assert sorted(seen) == list(range(first, first + count))
    with pytest.raises(SpecError, match="gfx942's device library has no row-pair reads of the sm90 preshuffle"):
        source(SPEC, "gfx942", tune={"qkv.rows_first": 1}, tokens=1)
    with pytest.raises(SpecError, match="rows_first takes rows out of a stream-K split whose CTAs normalize"):
        source(SPEC, "sm90", tune={"qkv.rows_first": 1}, tokens=4)
    with pytest.raises(SpecError, match=r"rows \[2304, 64\] are not one of the row ranges"):
        source(SPEC, "sm90", tune={"qkv.rows_first": 1, "qkv.rows_first_range": ["IQ_OFF", 64]}, tokens=1)


def test_epoch_by_count():
    """mailbox.advance=count (both specs'; last_out the default): every thread takes the epoch as
    the u64 counter / BLOCKS at its start, thread 0 counts the CTA out after the last barrier with
    a reduction (sm90 REDG, AMD an atomic without return), and no CTA waits for the last-out
    atomic or its release; builds for every target compile without spills. The IR's host view of
    the counter follows: the epoch, and the counter after one or n launches, across the low
    word's wrap."""
    for spec, params in (("minimax_m3/pre_attn", dict(tokens=1)), ("deepseek_v41/attn_front", dict(tokens=16, tp=4))):
        for target in ("sm90", "gfx942"):
            ir, plain = source(spec, target, tune={"mailbox.advance": "last_out"}, **params)
            ir_spec, tuned = source(spec, target, **params)
            assert ir_spec.epoch_advance == "count"
            c = ir.counter_arg
            assert ir.epoch_advance == "last_out" and "atomic_add_u32(done, 1) == BLOCKS - 1" in plain
            assert "red_add_u64" not in plain[plain.index(f"MONO_KERNEL {ir.name}("):]
            kernel = tuned[tuned.index(f"MONO_KERNEL {ir.name}("):]
            assert f"const u32 epoch_now = u32(*reinterpret_cast<const u64*>({c}) / BLOCKS);" in kernel
            end = kernel[kernel.rindex("barrier();"):]
            assert f"if (thread_id() == 0) red_add_u64(reinterpret_cast<u64*>({c}), 1);" in end
            assert "atomic_add_u32" not in kernel and "store_relaxed_u32" not in kernel
            (report,) = jit.resource_report(tuned, "count.hip", get_target(target))
            assert report.spills == 0 and report.scratch_bytes == 0
    ir, _ = source("minimax_m3/pre_attn", "sm90", tune={"mailbox.advance": "last_out"}, tokens=1)
    assert ir.epoch([5, 0]) == 5 and ir.advanced([5, 0]) == [6, 0] and ir.advanced([5, 0], 3) == [8, 0]
    ir, _ = source("minimax_m3/pre_attn", "sm90", tokens=1)
    assert ir.blocks == 132 and ir.epoch([0, 0]) == 0 and ir.advanced([0, 0]) == [132, 0]
    assert ir.advanced([0, 0], 10_000) == [1_320_000, 0] and ir.epoch(ir.advanced([7, 0], 10_000)) == 10_000
    assert ir.epoch([132 * 7 + 131, 0]) == 7  # this launch's other CTAs already counted out: still 7
    low = (1 << 32) - 10  # the low word about to wrap: an i32 of -10
    assert ir.advanced([-10, 0]) == [122, 1] and ir.epoch([122, 1]) == ((1 << 32) + 122) // 132
    assert ir.epoch([-10, 0]) == low // 132
    with pytest.raises(SpecError, match="a tune may set only mailbox.advance of mailbox"):
        source("minimax_m3/pre_attn", "sm90", tune={"mailbox.tag_stride": 2}, tokens=1)
    with pytest.raises(SpecError, match="a tune may set only mailbox.advance of mailbox"):  # count_at, removed in session 49
        source("minimax_m3/pre_attn", "sm90", tune={"mailbox.count_at": "first_stage"}, tokens=1)
    with pytest.raises(SpecError, match="advance"):
        source("minimax_m3/pre_attn", "sm90", tune={"mailbox.advance": "first_in"}, tokens=1)


def test_epoch_by_slots():
    """mailbox.advance=slots: every thread takes the epoch from its CTA's own 32-byte sector of the
    scratch region `epochs` (placed after the spec's regions, one sector a CTA), and thread 0
    stores epoch + 1 there after the last barrier, CTA 0 into the counter too (plain stores: no
    atomic, no reduction, no shared line); builds for every target compile without spills. The
    host's view of the counter is last_out's, (epoch + launches, 0). A spec region named
    `epochs` is refused under slots only."""
    for spec, params in (("minimax_m3/pre_attn", dict(tokens=1)), ("deepseek_v41/attn_front", dict(tokens=6, tp=4))):
        for target in ("sm90", "gfx942"):
            ir_spec, _ = source(spec, target, **params)
            ir, src = source(spec, target, tune={"mailbox.advance": "slots"}, **params)
            slots = ir.epoch_slots
            assert ir_spec.epoch_slots is None and slots is not None
            assert [r for r in ir.regions if r.name != "epochs"] == list(ir_spec.regions), "the other regions stay"
            assert slots.offset >= max(r.offset + r.nbytes for r in ir_spec.regions)
            assert slots.count == ir.blocks * ir.slot_words and slots.nbytes == ir.blocks * 32
            assert ir.scratch_bytes >= slots.offset + slots.nbytes
            kernel = src[src.index(f"MONO_KERNEL {ir.name}("):]
            assert f"mb.epochs = reinterpret_cast<u32*>({ir.scratch_arg} + {slots.offset});" in kernel
            assert "u32* const epoch_slot = mb.epochs + block_id() * 8;" in kernel
            assert kernel.index("mb.epochs = ") < kernel.index("epoch_slot = ") < kernel.index("const u32 epoch_now = *epoch_slot;")
            end = kernel[kernel.rindex("barrier();"):]
            assert "store_relaxed_u32(epoch_slot, epoch_now + 1);" in end
            assert (f"if (block_id() == 0) store_relaxed_u32(reinterpret_cast<u32*>({ir.counter_arg}), "
                    "epoch_now + 1);") in end
            assert "atomic_add_u32" not in kernel and "red_add_u64" not in kernel
            (report,) = jit.resource_report(src, "slots.hip", get_target(target))
            assert report.spills == 0 and report.scratch_bytes == 0
    assert ir.epoch([5, 0]) == 5 and ir.advanced([5, 0]) == [6, 0] and ir.advanced([5, 0], 3) == [8, 0]
    text = spec_path(SPEC).read_text().replace("\nstages:\n", "\n  - {name: epochs, kind: words, count: 8}\nstages:\n", 1)
    loaded = parse_spec(text, "reserved.yaml")
    lower(loaded, make_build(loaded, "sm90", tokens=1))  # the name is free under count
    loaded = parse_spec(text, "reserved.yaml", tune=(("mailbox.advance", "slots"),))
    with pytest.raises(SpecError, match="'epochs' is taken by mailbox.advance slots"):
        lower(loaded, make_build(loaded, "sm90", tokens=1))


def test_grid_carveout_tune():
    """grid.smem_carveout=N (MiniMax's spec: 0 on sm90): the build prefers N % shared memory, its
    header names the value and the tune, -1 leaves it to the driver (no header line); a value AMD
    cannot take, or another grid field, is refused."""
    ir, src = source("minimax_m3/pre_attn", "sm90", tokens=1)
    assert ir.smem_carveout == 0 and "// L1 / shared memory: 0 % as shared memory preferred" in src
    ir, src = source("minimax_m3/pre_attn", "sm90", tune={"grid.smem_carveout": -1}, tokens=1)
    assert ir.smem_carveout == -1 and "L1 / shared memory:" not in src
    ir, src = source("minimax_m3/pre_attn", "sm90", tune={"grid.smem_carveout": 100}, tokens=1)
    assert ir.smem_carveout == 100 and "// L1 / shared memory: 100 % as shared memory preferred" in src
    assert "grid.smem_carveout=100" in src[:src.index("ABI (kernel arguments")]
    ir, _ = source("minimax_m3/pre_attn", "sm90", tune={"grid.smem_carveout": {"default": -1, "sm90": 50}}, tokens=1)
    assert ir.smem_carveout == 50
    with pytest.raises(SpecError, match="gfx942 has no L1 / shared memory carveout"):
        source("minimax_m3/pre_attn", "gfx942", tune={"grid.smem_carveout": 100}, tokens=1)
    with pytest.raises(SpecError, match="a tune may set only grid.smem_carveout of grid"):
        source("minimax_m3/pre_attn", "sm90", tune={"grid.blocks": 66}, tokens=1)


def test_symbol_override():
    """symbols.NAME replaces a spec symbol for the build (named in the header like a stage
    knob): INLINE_NORM_TOKENS 4 makes S = 4's GEMV CTAs normalize the rows themselves (no
    norm stage), which still compiles for sm90 without spills (S = 8 / 16 would spill)."""
    _, plain = source(SPEC, "sm90", tokens=4)
    _, inline = source(SPEC, "sm90", tokens=4, tune={"symbols.INLINE_NORM_TOKENS": 4})
    assert "namespace stage_norm {" in plain and "namespace stage_norm {" not in inline
    assert "// tune:   symbols.INLINE_NORM_TOKENS=4" in inline
    (report,) = jit.resource_report(inline, "inline4.hip", get_target("sm90"))
    assert report.spills == 0 and report.scratch_bytes == 0


def test_nested_and_per_target_symbol_overrides(tmp_path):
    """Values frozen at every depth for the cache key and given back as written: a placement
    (mapping in a mapping) and a per-target symbol, through the CLI's YAML parsing too."""
    ds = "deepseek_v41/attn_front"
    place = {"xq.placement_by_target": {"sm90": {"round_robin": {"first": 0}}}}
    ir, _ = source(ds, "sm90", tokens=48, tune=place)
    assert next(st for st in ir.stages if st.name == "xq").first == 0
    assert load_spec(ds, tune_items(place)) is load_spec(ds, tune_items(dict(place)))  # one cache entry
    ir, _ = source(ds, "sm90", tokens=4, tune={"symbols.WQKV_QUARTERS": {"default": 1, "sm90": 0}})
    assert next(c.value for c in ir.constants if c.name == "K_PARTS") == 2
    assert main(["rolemap", ds, "--target", "sm90", "--tokens", "48", "--tune",
                 "xq.placement_by_target={sm90: {round_robin: {first: 0}}}", "-o", str(tmp_path / "r.png")]) == 0


def test_cli_show_tune(capsys):
    assert main(["show", SPEC, "--tokens", "4", "--tune", "qkv.bulk_copies=1"]) == 0
    out = capsys.readouterr().out
    assert "// tune:   qkv.bulk_copies=1" in out and BULK_CALL in out


def test_cli_bad_tune_is_a_located_error(capsys):
    assert main(["show", SPEC, "--tune", "nope.x=1"]) == 1
    err = capsys.readouterr().err
    assert "pre_attn.yaml:" in err and "no stage 'nope'" in err and "fix: use one of norm, qkv" in err


def test_a_diagnostic_stamp_by_override():
    """qkv.staged_point (off in the spec) stamps the spare point once the staged weights landed:
    after the one wait for them all, or (segment_waits, the spec's at S = 1) the last segment's;
    qkv.first_staged_point after the first segment's wait (segment_waits only);
    qkv.normed_point (off too) once the inline norm's rows are in LDS, refused for a build whose
    norm runs as its own stage."""
    _, plain = source(SPEC, "sm90", tokens=1, timeline=True)
    assert "stamp(lds, TL_SPARE);" not in plain
    _, tuned = source(SPEC, "sm90", tune={"qkv.staged_point": "spare", "qkv.segment_waits": 0}, tokens=1, timeline=True)
    lines = tuned.splitlines()
    at = lines.index("    stamp(lds, TL_SPARE);")
    assert "bulk_wait(wbar, 0, mb.tag);" in "\n".join(lines[at - 3:at])  # right after the wait for the bulk copies
    _, tuned = source(SPEC, "sm90", tune={"qkv.staged_point": "spare"}, tokens=1, timeline=True)
    lines = tuned.splitlines()
    at = lines.index("            if (staged == n_staged - 1) stamp(lds, TL_SPARE);  // the last one")
    assert lines[at - 1].strip().startswith("bulk_wait(wbar + staged, 0, mb.tag);")
    with pytest.raises(SpecError, match="no timeline point 'landed'"):
        source(SPEC, "sm90", tune={"qkv.staged_point": "landed"}, tokens=1)
    with pytest.raises(SpecError, match="staged_point stamps the wait for the weights lds_prefetch stages, which this "
                                        "build leaves out"):
        source(SPEC, "gfx942", tune={"qkv.staged_point": "spare"}, tokens=1)  # AMD stages no weights
    # qkv.first_staged_point: the first segment's wait over (segment_waits only)
    _, tuned = source(SPEC, "sm90", tune={"qkv.first_staged_point": "spare"}, tokens=1, timeline=True)
    lines = tuned.splitlines()
    at = lines.index("            if (staged == 0) stamp(lds, TL_SPARE);  // the first one")
    assert lines[at - 1].strip().startswith("bulk_wait(wbar + staged, 0, mb.tag);")
    with pytest.raises(SpecError, match="use staged_point, or turn segment_waits on"):
        source(SPEC, "sm90", tune={"qkv.first_staged_point": "spare"}, tokens=2)  # the spec's S = 2 waits once
    # qkv.normed_point: the inline norm's rows in LDS (S = 1: every CTA norms the token itself),
    # before the rows-first pair's dots and the ready point after them
    _, tuned = source(SPEC, "sm90", tune={"qkv.normed_point": "spare"}, tokens=1, timeline=True)
    lines = tuned.splitlines()
    at = lines.index("    stamp(lds, TL_SPARE);")
    assert lines[at - 1] == "    barrier();" and lines[at - 3] == "        if (tid == 0) xs[tk] = scale;"
    assert lines[at + 1].strip().startswith("row_pair_dots(") and lines[at + 2] == "    stamp(lds, TL_X8_READY);"
    with pytest.raises(SpecError, match=r"pre_attn.yaml:\d+: stages.1.normed_point: \[sm90 tokens=16 .*\] normed_point "
                                         r"stamps the inline norm's rows, but this build's norm runs as stage 'norm'"):
        source(SPEC, "sm90", tune={"qkv.normed_point": "spare"}, tokens=16, timeline=True)


def test_scorer_item_stamps():
    """scores.item_point / dots_point / put_point (analysis stamps, off in the spec): the phases
    of one item on every CTA (tensor cores: warp 0's `stamped_item`-th; CUDA cores: the batch
    holding the CTA's), in order around the dots and the put; setup_point: the stage's start
    done (requests and first pages in LDS), before the first keys are asked for; groups_point:
    the warp groups' loop entered, before its first ask; iq_start_point:
    right before make_index_q (both dots' paths); iq_point: thread 0's index q rows made, before
    the barrier that publishes them to the CTA; the untuned
    build has none of it, and the stamped build still compiles for sm90 without spills."""
    _, plain = source(SPEC, "sm90", tokens=16, timeline=True)
    tune = {"scores.stamped_item": 3, "scores.item_point": "spare", "scores.dots_point": "x8_ready",
            "scores.put_point": "head_got_qkv", "qkv.ready_point": None, "heads.got_point": None}
    _, tuned = source(SPEC, "sm90", tokens=16, timeline=True, tune=tune)
    assert "STAMPED_ITEM" not in plain and "constexpr int STAMPED_ITEM = 3;" in tuned
    run = tuned[tuned.index("namespace stage_scores {"):]
    stamps = [run.index(f"if (wave_id() == 0 && k == STAMPED_ITEM) stamp(lds, TL_{p});")
              for p in ("SPARE", "X8_READY", "HEAD_GOT_QKV")]
    calls = [run.index(c) for c in ("block_dots(iq_r + nb", "mailbox_put(iscore + pair_of(it")]
    assert stamps[0] < calls[0] < stamps[1] < calls[1] < stamps[2]  # start, dots, put: in order around the calls
    (report,) = jit.resource_report(tuned, "stamped.hip", get_target("sm90"))
    assert report.spills == 0 and report.scratch_bytes == 0
    _, cores = source(SPEC, "sm90", tokens=16, timeline=True, tune={**tune, **CUDA_CORES})
    run = cores[cores.index("namespace stage_scores {"):]
    stamps = [run.index(f"if (j <= STAMPED_ITEM && STAMPED_ITEM < j + BATCH) stamp(lds, TL_{p});")
              for p in ("SPARE", "X8_READY", "HEAD_GOT_QKV")]
    calls = [run.index(c) for c in ("item_dots(iq, seq, bp + i", "item_put(a, mb, bp + i")]
    assert stamps[0] < calls[0] < stamps[1] < calls[1] < stamps[2]
    _, setup = source(SPEC, "sm90", tokens=1, timeline=True,
                      tune={"scores.setup_point": "spare", "scores.iq_point": "x8_ready", "qkv.ready_point": None})
    end = setup.index("}  // namespace stage_scores")
    run = setup[setup.rindex("MONO_DEVICE void run(", 0, end):end]
    assert "stamp(lds, TL_SPARE);" not in plain
    assert run.index("    setup(a, lds);\n") < run.index("stamp(lds, TL_SPARE);") < run.index("score_by_warps(")
    groups = setup[setup.index("MONO_DEVICE void score_by_groups("):end]
    made = groups.index("make_index_q(")
    assert made < groups.index("stamp(lds, TL_X8_READY);") < groups.index("barrier();", made)
    for tokens, target in ((16, "sm90"), (16, "gfx942")):  # iq_start_point: right before make_index_q, both dots' paths
        _, start = source(SPEC, target, tokens=tokens, timeline=True, tune={"scores.iq_start_point": "spare"})
        scores = start[start.index("namespace stage_scores {\n"):start.index("}  // namespace stage_scores")]
        assert scores.count("stamp(lds, TL_SPARE);") == 1
        assert scores[scores.index("stamp(lds, TL_SPARE);"):].split("\n")[1].strip().startswith("make_index_q(")
    # groups_point: thread 0 entering its warp groups' loop, before the first keys are asked for
    _, entry = source(SPEC, "sm90", tokens=16, timeline=True,
                      tune={"scores.groups_point": "head_got_qkv", "scores.iq_start_point": "spare"})
    groups = entry[entry.index("MONO_DEVICE void score_by_groups("):entry.index("}  // namespace stage_scores")]
    assert (groups.index("stamp(lds, TL_HEAD_GOT_QKV);") < groups.index("ask_next_tile(")
            < groups.index("stamp(lds, TL_SPARE);") < groups.index("make_index_q("))
    with pytest.raises(SpecError, match="no timeline point 'keys'"):
        source(SPEC, "sm90", tune={"scores.dots_point": "keys"}, tokens=1)
    with pytest.raises(SpecError, match=r"stamped_item: .* must be an integer >= 0, got -1"):
        source(SPEC, "sm90", tune={"scores.stamped_item": -1, "scores.put_point": "spare"}, tokens=1)


def test_stream_k_hand_off_stamps():
    """qkv.piece_point / qkv.tail_point / qkv.mmas_point (analysis stamps, off in the spec): the head
    piece put, the tail's lower piece seen, the last segment's MMAs done; each names a timeline point
    like the kinds' own, and is refused by a build without stream-K (it would stamp nothing)."""
    _, plain = source(SPEC, "sm90", tokens=1, timeline=True)
    _, tuned = source(SPEC, "sm90", tokens=1, timeline=True, tune={
        "qkv.piece_point": "spare", "qkv.tail_point": "head_got_qkv", "heads.got_point": None})
    assert "stamp(lds, TL_SPARE);" not in plain and "stamp(lds, TL_SPARE);" in tuned
    assert "if (seg.k0 > 0) stamp(lds, TL_HEAD_GOT_QKV);" in tuned
    with pytest.raises(SpecError, match="no timeline point 'landed'"):
        source(SPEC, "sm90", tune={"qkv.piece_point": "landed"}, tokens=1)
    # qkv.mmas_point: the last segment's MMAs done by every wave, after its barrier, before its epilogue
    _, tuned = source(SPEC, "sm90", tokens=1, timeline=True, tune={"qkv.mmas_point": "spare"})
    gemv = tuned[tuned.index("namespace stage_qkv {"):tuned.index("}  // namespace stage_qkv")]
    assert "        barrier();\n        if (g == g_first) stamp(lds, TL_SPARE);" in gemv
    assert gemv.count("stamp(lds, TL_SPARE)") == 1
    # a build without stream-K (the spec's AMD targets) has none of the three places: refused, not silent
    for field in ("piece_point", "tail_point", "mmas_point"):
        with pytest.raises(SpecError, match=rf"stages.1.{field}: .*{field} stamps .*, which this build leaves out"
                                            rf"\n.*fix: turn stream_k on for this target, or {field} off"):
            source(SPEC, "gfx942", tune={f"qkv.{field}": "spare"}, tokens=1)


def test_scorer_warp_groups():
    """The spec's sm90 scorer (tensor cores): a CTA picks its items' group size at run time
    (1, 2, 4 or 8 warps an item, by busy_waves) and runs the loop built for it; no CTA
    barrier inside the loop, only the group's (a named barrier, or the warp's own sync),
    each warp's maxima of two items in LDS; the index-K head tasks waited for as a warp.
    busy_waves and tiles_ahead reach the source (more than one tile ahead with the keys' LDS
    ring: key_regs off); every build compiles for sm90 without spills or local memory. The
    scores are checked on the GPU for several busy_waves (tests/test_minimax_pre_attn_gpu.py)."""
    _, text = source(SPEC, "sm90", tokens=16)
    assert "mma_f16_16x8x16(c[s & 1], f.a[s], b0, b1)" in text and "e4m3x2_lo_f16x2(wg[s])" in text
    scores = text[text.index("namespace stage_scores {"):]
    assert "constexpr int BUSY_WAVES = 8;" in scores and "constexpr int RING = 2;" in scores
    assert all(f"case {g}: score_by_groups<{g}>(" in scores for g in (1, 2, 4))
    assert "default: score_by_groups<TILES>(" in scores
    loop = scores[scores.index("MONO_DEVICE void score_warp_items("):scores.index("MONO_DEVICE void score_by_groups(")]
    assert "barrier()" not in loop and "gr.sync();" in loop
    assert "else barrier_of(1 + id, G * WAVE);" in scores and "wait_new_keys<WAVE>(mb" in scores
    assert 'asm volatile("bar.sync %0, %1;"' in text
    for tune, ring in (({}, 2), ({"scores.busy_waves": 1, "scores.tiles_ahead": 2, "scores.key_regs": 0}, 3), ({"scores.iq_first": 1}, 2),
                       ({"scores.iq_from_out": 0, "heads.iq_tagged": 0}, 2)):
        _, built = source(SPEC, "sm90", tokens=16, tune=tune)
        assert f"constexpr int RING = {ring};" in built
        (report,) = jit.resource_report(built, "groups.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0

def test_scorer_f16_dots():
    """scores.f16_dots (the spec's sm90 tensor-core dots): the keys by the hardware's e4m3 ->
    f16x2 conversion, f16 MMAs, each index-q row as f16 times 2^up with 2^-up in the row's
    first pad word, read back for the put instead of the bf16 path's DOT_UNSCALE; turned off,
    the bf16 path (keys scaled into bf16, one DOT_UNSCALE); S = 1 / 4 / 16 compile without
    spills both ways; refused on the CUDA-core dots. The scores are checked on the GPU
    (tests/test_minimax_pre_attn_gpu.py: the spec's and tune bf16-dots)."""
    for tokens in (1, 4, 16):
        _, text = source(SPEC, "sm90", tokens=tokens)
        scores = text[text.rindex("namespace stage_scores {"):]
        assert "mma_f16_16x8x16(c[s & 1], f.a[s], b0, b1)" in scores and "e4m3x2_lo_f16x2(wg[s])" in scores
        assert "bf16x2_scaled" not in scores and "DOT_UNSCALE" not in scores
        assert "row[DIM / 2] = float_as_u32(u32_as_float(u32(127 - up) << 23));" in scores
        assert "float_as_u32(v * unscale * SCALE)" in scores
        _, bf16 = source(SPEC, "sm90", tokens=tokens, tune={"scores.f16_dots": 0})
        scores = bf16[bf16.rindex("namespace stage_scores {"):]
        assert "mma_bf16_16x8x16(c[s & 1], f.a[s], b0, b1)" in scores and "e4m3x2_lo_bf16x2_scaled(wg[s])" in scores
        assert "mma_f16_16x8x16" not in scores and "DOT_UNSCALE" in scores
        for built in (text, bf16):
            (report,) = jit.resource_report(built, "f16_dots.hip", get_target("sm90"))
            assert report.spills == 0 and report.scratch_bytes == 0
    with pytest.raises(SpecError, match="f16_dots picks the tensor-core dots' input type"):
        source(SPEC, "sm90", tokens=4, tune={**CUDA_CORES, "scores.f16_dots": 1})


def test_scorer_iq_regs():
    """scores.iq_regs (sm90 tensor-core dots, off in the spec): block 0's B fragments loaded into
    registers once an item, before its tiles, and the tiles' dots take them from there (blocks
    1.. still from LDS); with and without f16_dots, S = 1 / 16 and four index heads at S = 16 (128
    registers; without key_regs: with it, 52 registers spill) compile without spills; the spec's
    source does not change; refused on the CUDA-core dots. The scores are checked on the GPU
    (tests/test_minimax_pre_attn_gpu.py, tune iq-regs)."""
    _, plain = source(SPEC, "sm90", tokens=16)
    assert "IqFrags" not in plain and "block_dots(iq_r + nb * 8 * IQ_WORDS, f, c);" in plain
    for tokens, tune, params in ((1, {}, {}), (16, {}, {}), (16, {"scores.f16_dots": 0}, {}),
                                 (16, {"scores.iq_from_out": 0, "heads.iq_tagged": 0, "scores.key_regs": 0},
                                  {"index_heads": 4})):
        _, text = source(SPEC, "sm90", tokens=tokens, tune={"scores.iq_regs": 1, **tune}, **params)
        loop = text[text.index("MONO_DEVICE void score_warp_items("):text.index("MONO_DEVICE void score_by_groups(")]
        assert loop.index("const IqFrags q0 = iq_frags(iq_r);") < loop.index("for (int i = 0; i < PER; ++i) {")
        assert "block_dots(q0, f, c);" in loop and "block_dots(iq_r + nb * 8 * IQ_WORDS, f, c);" in loop
        (report,) = jit.resource_report(text, "iq_regs.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    with pytest.raises(SpecError, match="iq_regs holds the tensor-core dots' B fragments"):
        source(SPEC, "sm90", tokens=4, tune={"scores.iq_regs": 1, **CUDA_CORES})


def test_scorer_key_regs():
    """scores.key_regs (the spec's sm90 tensor-core dots above 8 rows): each lane's 64 bytes of a
    tile by four 16-byte loads into the stream's registers a tile ahead (coherent for a block that
    may hold a new key), no cp.async, no LDS ring (its buffer gone from the LDS plan); S = 1 / 16,
    with iq_regs too, with bf16 dots, and four index heads compile without spills; the spec's S = 4
    keeps the ring; refused on the CUDA-core dots and with more than one tile ahead. The scores are
    checked on the GPU (tests/test_minimax_pre_attn_gpu.py: the spec's, tunes key-regs and key-ring)."""
    _, ring = source(SPEC, "sm90", tokens=4)
    assert "LDS_RING" in ring and "const Keys keys = st.ahead;" not in ring
    for tokens, tune, params in ((1, {}, {}), (16, {}, {}), (16, {"scores.iq_regs": 1}, {}), (16, {"scores.f16_dots": 0}, {}),
                                 (16, {"scores.iq_from_out": 0, "heads.iq_tagged": 0}, {"index_heads": 4})):
        ir, text = source(SPEC, "sm90", tokens=tokens, tune={"scores.key_regs": 1, **tune}, **params)
        scores = text[text.rindex("namespace stage_scores {"):]
        assert "copy_key_pieces(" not in scores[scores.index("MONO_DEVICE void ask_next_tile("):]
        assert "st.ahead.k[3] = key_bytes(st.it, kp + 8 * DIM + 64);" in scores
        assert "const Keys keys = st.ahead;" in scores and "copy_async_wait_pending" not in scores
        assert "u32x4* ring = nullptr;" in scores and "LDS_RING" not in scores
        assert not any(b.name == "ring" for b in ir.lds if b.stage == "scores")
        (report,) = jit.resource_report(text, "key_regs.hip", get_target("sm90"))
        assert report.spills == 0 and report.scratch_bytes == 0
    with pytest.raises(SpecError, match="key_regs replaces the tensor-core dots' LDS ring"):
        source(SPEC, "sm90", tokens=1, tune={**CUDA_CORES, "scores.key_regs": 1})
    with pytest.raises(SpecError, match="key_regs holds one tile ahead in registers"):
        source(SPEC, "sm90", tokens=4, tune={"scores.key_regs": 1})


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_minimax_flag_waits_acquire_in_the_polling_threads(target):
    """MiniMax's waits for data behind flags: the qkv GEMV's wait for the x8 rows and the
    scorer's wait for this launch's index keys acquire in the polling threads (mailbox_wait<true>)
    and pass it on with barrier_acquire() / wave_acquire(): no CTA-wide fence_acquire(), whose
    sm90 CCTL.IVALL waits for every load in flight (the GEMV's weights, the scorer's cp.async
    key groups). The AMD wave_acquire keeps a fence after its sync (barrier_acquire's body: the
    DeepSeek twin, tests/test_deepseek_front_lower.py)."""
    _, text = source(SPEC, target, tokens=16)
    gemv = text[text.index("namespace stage_qkv {"):text.index("}  // namespace stage_qkv")]
    assert "mailbox_wait<true>(mb." in gemv and "barrier_acquire();" in gemv and "fence_acquire" not in gemv
    scores = text[text.index("namespace stage_scores {"):]
    wait = scores[scores.index("MONO_DEVICE void wait_new_keys("):]
    wait = wait[:wait.index("\n}\n")]
    assert "mailbox_wait<true>(" in wait and "barrier_acquire();" in wait and "wave_acquire();" in wait
    assert "fence_acquire" not in wait
    lib = text[:text.index("namespace stage_")]
    body = lib[lib.index("MONO_DEVICE void wave_acquire()"):]
    body = body[:body.index("}\n") + 2]
    assert ("fence_acquire();" in body) is (target != "sm90")


def test_norm_done_point():
    """norm.done_point (rmsnorm_fp8, off in the spec): a norm CTA stamps it after each of its rows'
    flags is put, so only the CTAs with a task stamp it, at their last row (timeline builds; S > 2,
    where the norm stage runs); start_point, which the kind does not stamp, is refused by name."""
    _, text = source(SPEC, "sm90", tune={"norm.done_point": "spare"}, tokens=4, timeline=True)
    norm = text[text.index("namespace stage_norm {"):text.index("}  // namespace stage_norm")]
    run = norm[norm.index("MONO_DEVICE void run("):]
    assert run.index("mailbox_put(mb.x8s + tk") < run.index("stamp(lds, TL_SPARE);  // the CTA's (last) row published")
    _, spec = source(SPEC, "sm90", tokens=4, timeline=True)
    assert "TL_SPARE);  // the CTA's rows" not in spec
    with pytest.raises(SpecError, match="a rmsnorm_fp8 stage does not stamp start_point"):
        source(SPEC, "sm90", tune={"norm.start_point": "spare"}, tokens=4)


def test_scorer_item_table_and_static_item_starts():
    """scores.item_table (the spec's sm90): setup() puts each of the CTA's first PAGES items (as
    own_item finds it) in a word after its page, in a pages buffer of twice the threads, and the
    streams read them there (item_at) instead of walking the requests; off, the walk and a buffer
    of one page a thread. scores.static_item_starts (the spec's sm90): each ask_next_tile call
    passes the tile's place in its item as an expression of the unrolled loop's index (key
    registers: the next tile, (i + 1) % PER; the ring: RING - 1 ahead), and the prologue's asks
    are unrolled; off, the stream's count. S = 1 / 4 / 16, both on or off, compile without spills;
    both refused on the CUDA-core dots. The scores are checked on the GPU (tunes spec and
    items-walked)."""
    for tokens, ahead in ((1, "(i + RING - 1) % PER"), (4, "(i + RING - 1) % PER"), (16, "(i + 1) % PER")):
        for on in (True, False):
            tune = None if on else {"scores.item_table": 0, "scores.static_item_starts": 0}
            ir, text = source(SPEC, "sm90", tokens=tokens, tune=tune)
            scores = text[text.rindex("namespace stage_scores {"):]
            pages = next(b for b in ir.lds if b.stage == "scores" and b.name == "pages")
            assert pages.count == ir.threads * (2 if on else 1)
            assert ("pages[PAGES + tid] = int(item_word(mine));" in scores) is on
            assert ("st.it = item_at(reqs, pages, st.cur, deal, j, requests);" in scores) is on
            assert ("const Item it = item_at(reqs, pages, cur, deal, gr.id + k * gr.COUNT, requests);" in scores) is on
            assert (f"ring, {ahead});" in scores) is on and ("ring, st.s % PER);" in scores) is not on
            assert ("#pragma unroll\n    for (int s = 0; s < RING - 1; ++s) ask_next_tile(" in scores) is on
            (report,) = jit.resource_report(text, "items.hip", get_target("sm90"))
            assert report.spills == 0 and report.scratch_bytes == 0
    for knob, why in (("item_table", "item_table serves the tensor-core dots' streams"),
                      ("static_item_starts", "static_item_starts shapes the tensor-core dots' unrolled tile loop")):
        with pytest.raises(SpecError, match=why):
            source(SPEC, "sm90", tokens=4, tune={**CUDA_CORES, f"scores.{knob}": 1})  # (CUDA_CORES: both off)


def test_scorer_iq_own_requests():
    """scores.iq_own_requests (the spec's sm90 above one row): setup() marks in a kernel-lifetime
    `want` word a request the requests of the CTA's items (every thread's own item, and from the
    last thread's request on: the items past the first THREADS follow it in the work list), and
    make_index_q skips the others. S = 2 / 4 / 16 compile without spills on sm90, and S = 16 on
    gfx950 (CUDA-core dots); off (the spec's S = 1, or the knob 0), no `want`. The scores are
    checked on the GPU (tunes spec, iq-all-requests, iq-own-requests-cuda-cores)."""
    for tokens in (1, 2, 4, 16):
        for tune in (None, {"scores.iq_own_requests": 0}):
            on = tune is None and tokens > 1
            ir, text = source(SPEC, "sm90", tokens=tokens, tune=tune)
            scores = text[text.rindex("namespace stage_scores {"):]
            assert any(b.stage == "scores" and b.name == "want" and b.count == tokens for b in ir.lds) is on
            assert ("if (!want[r]) continue;" in scores) is on
            if not on:
                assert "want" not in scores
                continue
            setup = scores[scores.index("MONO_DEVICE void setup("):]
            assert (setup.index("want[tid] = 0u;") < setup.index("barrier();")
                    < setup.index("if (mine.valid) want[mine.r] = 1u;"))
            assert "for (int r = mine.r + 1; r < requests; ++r) want[r] = 1u;" in setup
            assert "make_index_q(a, mb, reqs, iq, requests, q_len, reinterpret_cast<const u32*>(lds + LDS_WANT));" in scores
            (report,) = jit.resource_report(text, "own_requests.hip", get_target("sm90"))
            assert report.spills == 0 and report.scratch_bytes == 0
    _, text = source(SPEC, "gfx950", tokens=16, tune={"scores.iq_own_requests": 1})
    assert "if (!want[r]) continue;" in text
    (report,) = jit.resource_report(text, "own_requests.hip", get_target("gfx950"))
    assert report.vgpr_spills == 0 and report.scratch_bytes == 0


def test_minimax_gpu_tunes_lower():
    """Every tune the MiniMax GPU file runs (GEMV_TUNES at each of its row counts, SCORER_TUNES at
    each score case's rows and pinned blocks, CP_TUNES with four index heads at each context-parallel
    case's rows) lowers and renders for sm90 here, so that the lent GPU's minutes go to running
    them, not to a spec error."""
    from tests import test_minimax_pre_attn_gpu as gpu
    for tune in gpu.GEMV_TUNES.values():
        for tokens in gpu.TOKENS:
            source(SPEC, "sm90", tokens=tokens, tune=tune)
    for tune in gpu.SCORER_TUNES.values():
        for tokens, _q_len, _contexts, *pinned in gpu.SCORE_CASES:
            init_blocks, local_blocks = pinned or (0, 1)
            source(SPEC, "sm90", tokens=tokens, tune=tune, init_blocks=init_blocks, local_blocks=local_blocks)
    for tune_id in ("spec", *gpu.CP_TUNES):
        for tokens, _q_len, _contexts in gpu.CP_CASES:
            source(SPEC, "sm90", tokens=tokens, tune=gpu.SCORER_TUNES[tune_id], index_heads=4, index_own=1)
