"""The sm90 probe scripts (scripts/probe_*.py, broadcast_probe.py, pdl_probe.py, run on the lent H200): their
CUDA sources compile with nvrtc here, and the wgmma probe's fragment layouts are the mma.sync
m16n8k32 ones it claims (checked element by element on the CPU); the scoreboard and timeline
scripts' arithmetic on made-up listings and stamps, and code_footprint's attribution; the no-MMA
and no-key-loads probe builds (--no-mma, --no-key-loads); the wgmma precision model's arithmetic (scripts/precision_model.py);
compile_offset_probe's own kernels and its documented steps."""

from __future__ import annotations

import torch

from codegen.jit import cuda
from codegen.targets import get_target
from codegen.reference import minimax_m3
from scripts import (broadcast_probe, code_footprint, heads_twice, ncu_stalls, no_key_loads, no_mma, pdl_probe,
                     precision_model, probe_fp8_convert, probe_wgmma_fp8, sass_same, sass_scoreboards, stream_probe)


def test_probe_sources_compile():
    for mod in (probe_wgmma_fp8, probe_fp8_convert, broadcast_probe, stream_probe):
        assert len(cuda.compile(mod.SOURCE, "probe.cu", get_target("sm90"))) > 1000


def test_stream_probe_phase_fit_finds_the_period():
    """stream_probe.py --phase: waits that ramp with the shares' phase in a 768 KB period (and
    drop at its wrap) correlate best with that period; waits at random do with none."""
    share, offset = 119152, 119152 - stream_probe.FIRST_PIECE
    c = torch.arange(132, dtype=torch.float64)
    # the ramp drops where the pieces' phase passes 3/16 of the period, not at 0
    ramp = 5.0 + 2.0 * torch.remainder((c * share + offset) / (768 * 1024) - 3 / 16, 1.0)
    fits = dict(stream_probe.phase_fit(ramp, share, offset))
    assert fits[768] > 0.99 and max(r for kb, r in fits.items() if kb != 768) < 0.9
    noise = 5.0 + torch.rand(132, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert max(abs(r) for _, r in stream_probe.phase_fit(noise, share)) < 0.5


def test_pdl_probe_wait_only_build():
    """pdl_probe's `wait only` way: the spec's source without the trigger (still waiting for the
    previous launch before any access) compiles; the source holds the trigger exactly once."""
    import codegen

    kernel = codegen.load(pdl_probe.SPEC, tokens=1, tp=4, target="sm90")
    assert kernel.source.count(pdl_probe.TRIGGER) == 1
    wait_only = kernel.source.replace(pdl_probe.TRIGGER, "")
    assert "launch_dependents();" not in wait_only.split("MONO_KERNEL deepseek_v41_attn_front(")[1]
    assert "    wait_for_previous_launch();\n" in wait_only
    assert len(cuda.compile(wait_only, kernel.file_name, get_target("sm90"))) > 1000


def test_wgmma_probe_layouts():
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, 256, (2, 64, 32), generator=g, dtype=torch.uint8)
    frag = probe_wgmma_fp8.a_fragments(a.view(torch.float8_e4m3fn)).view(torch.uint8).reshape(2, 128, 4, 4)
    for w in range(4):
        for lane in range(32):
            gr, q = lane // 4, lane % 4
            th = 32 * w + lane
            for reg, (row, k0) in enumerate(((gr, 4 * q), (gr + 8, 4 * q), (gr, 16 + 4 * q), (gr + 8, 16 + 4 * q))):
                assert torch.equal(frag[:, th, reg], a[:, 16 * w + row, k0:k0 + 4])
    b = torch.randint(0, 256, (2, 8, 32), generator=g, dtype=torch.uint8)
    core = probe_wgmma_fp8.b_core(b.view(torch.float8_e4m3fn))
    for n in range(8):
        for k in range(32):  # core matrix k // 16 at 128 B, row n at 16 B
            assert torch.equal(core[:, 128 * (k // 16) + 16 * n + k % 16], b[:, n, k])
    d = torch.arange(2 * 128 * 4, dtype=torch.float32).reshape(2, 128, 4)
    tile = probe_wgmma_fp8.d_layout(d)
    for th in (0, 5, 37, 127):
        w, gr, q = th // 32, th % 32 // 4, th % 4
        assert tile[1, 16 * w + gr, 2 * q].item() == d[1, th, 0].item()
        assert tile[1, 16 * w + gr + 8, 2 * q + 1].item() == d[1, th, 3].item()


# Three instructions of the sm90 S = 1 build of 08e6e6a, as `nvdisasm -hex` prints them: the
# q_inline norm's fourth partials poll (waits on scoreboards 0 and 5 before it issues), one of
# wq_b's weight loads (sets scoreboard 5), and the check of the poll's value (waits on 5).
SASS_LINES = """\
        /*8090*/              @!P2 LDG.E.128.CONSTANT R64, desc[UR6][R14.64] ;                               /* 0x000000060e40a981 */
                                                                                                             /* 0x000362000c1e9d00 */
        /*87f0*/                   LDG.E.128.STRONG.GPU R52, desc[UR6][R72.64+0x3800] ;                      /* 0x0038000648347981 */
                                                                                                             /* 0x021162000c1efd00 */
        /*8880*/                   ISETP.NE.AND P0, PT, R3.reuse, R53, PT ;                                  /* 0x000000350300720c */
                                                                                                             /* 0x060fe40003f05270 */
"""


def test_sass_scoreboards_decodes_the_control_bits():
    rows = sass_scoreboards.annotate(SASS_LINES)
    assert [(a, t.split()[0]) for a, _, t in rows] == [(0x8090, "@!P2"), (0x87F0, "LDG.E.128.STRONG.GPU"), (0x8880, "ISETP.NE.AND")]
    load, poll, check = (c for _, c, _ in rows)
    assert (load.write_sb, load.read_sb, load.wait, load.stall) == (5, 1, (), 1)
    assert (poll.write_sb, poll.read_sb, poll.wait, poll.stall) == (5, 0, (0, 5), 1)
    assert (check.write_sb, check.read_sb, check.wait, check.stall) == (None, None, (5,), 2)
    assert poll.text() == "w05     W5 R0 s 1"


def test_sass_scoreboards_finds_a_poll_held_by_weight_loads():
    rows = sass_scoreboards.annotate(SASS_LINES)
    held = sass_scoreboards.held_waits(rows)
    assert len(held) == 1 and held[0].startswith("087f0 LDG.E.128.STRONG.GPU waits for 1 global load(s), e.g. 08090")
    assert sass_scoreboards.held_waits(rows[1:]) == []  # without the weight load in flight: nothing held


def test_sass_same_compares_instructions_not_addresses(monkeypatch):
    """sass_same: the instructions with their operands, in order; the addresses and the control
    words' lines do not count."""
    monkeypatch.setattr(sass_scoreboards, "listing", lambda source, name: source)
    moved = SASS_LINES.replace("/*8090*/", "/*8190*/").replace("0x000362000c1e9d00", "0x000362000c1e9d01")
    assert sass_same.instructions(SASS_LINES) == sass_same.instructions(moved) == [
        "@!P2 LDG.E.128.CONSTANT R64, desc[UR6][R14.64]", "LDG.E.128.STRONG.GPU R52, desc[UR6][R72.64+0x3800]",
        "ISETP.NE.AND P0, PT, R3.reuse, R53, PT"]
    assert sass_same.instructions(SASS_LINES.replace("R53", "R54")) != sass_same.instructions(SASS_LINES)


def test_sass_scoreboards_finds_a_wait_that_splits_a_load_stream():
    """--false-waits: an instruction that waits on a scoreboard whose loads in flight write none
    of its registers, here in the middle of a batch of weight loads (the sm90 pattern of
    DeepSeek session 17: a register last loaded under a predicate, rewritten later)."""
    C = sass_scoreboards.Control

    def load(dest):  # a weight load that sets scoreboard 5
        return C(1, False, 5, None, (), 0), f"LDG.E.128.CONSTANT {dest}, desc[UR6][{dest}.64] ;"

    rows = [(0x100, *load("R52")), (0x110, *load("R56")),
            (0x120, C(1, False, None, None, (5,), 0), "IADD3 R40, P4, R16, UR4, RZ ;"),
            (0x130, *load("R40")), (0x140, C(1, False, None, None, (5,), 0), "FFMA R3, R40, R2, R3 ;")]
    found = sass_scoreboards.false_waits(rows)
    assert len(found) == 1 and found[0].startswith("00120 IADD3 R40")
    assert "for 2 global load(s) it does not use (splits a load batch: 1 more within 40 instructions)" in found[0]
    # the loads' consumer (FFMA reads R40) is no false wait; nor is a write of a loaded register
    rows[2] = (0x120, C(1, False, None, None, (5,), 0), "IADD3 R56, P4, R16, UR4, RZ ;")
    assert sass_scoreboards.false_waits(rows) == []
    assert sass_scoreboards._registers("LDG.E.128.CONSTANT R40, desc[UR6][R12.64] ;") == {40, 41, 42, 43, 12, 13}


def test_timeline_point_stats_take_the_median_launch():
    """codegen.trace.point_stats (both timeline scripts): per point, min / median / max over the
    CTAs that stamped it (us after the launch's first start), each the median over the launches;
    the stamps subtracted as integers (at ~1.8e18 ns a double keeps only 256 ns steps)."""
    import torch

    from codegen.trace import point_stats
    launches = []
    base = 1_800_000_000_000_000_000  # %globaltimer's size
    for shift, late in ((0, 3000), (500, 9000), (200, 4000)):  # ns; point "b": CTA 2 did not stamp it
        launches.append(torch.tensor([[1000 + shift, 2000 + shift], [1100 + shift, 2500 + shift],
                                      [1100 + shift, 0], [1200 + shift, 1000 + late + shift]], dtype=torch.int64)
                        + torch.tensor([[base, base], [base, base], [base, 0], [base, base]]))
    stats = point_stats(launches, ["a", "b"])
    assert stats["a"] == (0.0, 0.1, 0.2, 4)  # every launch alike, relative to its own first start
    lo, med, hi, n = stats["b"]
    assert (lo, med, n) == (1.0, 1.5, 3) and hi == 4.0  # max 3 / 9 / 4 us: the median launch's 4


def test_timeline_by_cta_ranks_ctas_by_their_median_launch(capsys):
    """scripts/timeline_probe.py --by-cta: each CTA's point as the median over the launches (us after
    each launch's own first start; a CTA that misses the point in any launch left out), the fastest
    and slowest by it, and the halves' correlation: near 1 where a CTA is late by its place."""
    from scripts.timeline_probe import by_cta
    base = 1_800_000_000_000_000_000  # %globaltimer's size: subtracted as integers
    launches = []
    for i in range(4):
        start = torch.tensor([1000, 1100, 1050, 1200, 1000], dtype=torch.int64) + 300 * i  # ns
        point = start + torch.tensor([5000, 9000, 6000, 7000, 8000]) + 100 * (i % 2)
        if i == 2:
            point[4] = 0  # CTA 4 misses the point once: left out
        launches.append(torch.stack([start + base, torch.where(point > 0, point + base, point)], 1))
    by_cta(launches, 1)
    out = capsys.readouterr().out
    # CTA 0: 5.0 / 5.1 us after its launch's first start (its own), the lower middle 5.0; CTA 1 9.1
    assert "by CTA (4 CTAs, median over 4 launches): min 5.00 median 6.05 max 9.10; halves' correlation 1.00" in out
    assert "fastest: 0 5.00, 2 6.05, 3 7.20, 1 9.10" in out
    assert "slowest: 1 9.10, 3 7.20, 2 6.05, 0 5.00" in out
    assert "every CTA, in order: 0:5.00 1:9.10 2:6.05 3:7.20" in out  # CTA 4 left out
    by_cta([torch.stack([lt[:, 0], torch.zeros_like(lt[:, 1])], 1) for lt in launches], 1)  # a point none stamps
    assert "no CTA stamps this point in every launch" in capsys.readouterr().out


def test_bycta_join_steps_cta_by_cta(tmp_path, capsys):
    """scripts/bycta_join.py: by-CTA runs of two stamps (each labelled by the field its tune sets to
    the spare point) joined per case; each step between them taken CTA by CTA, so a step that
    differs by CTA shows its spread where the runs' medians do not; --previous compares a run with
    the other's value on the CTA before; the latest CTAs with both values."""
    from scripts.bycta_join import main
    head = "S=1 contexts=[{}]  {{'qkv.{}': 'spare'}}, cold weights (8 copies): us from the first CTA's start"
    log = tmp_path / "bycta.log"
    log.write_text("\n".join([
        "=== qkv.piece_point=spare", head.format(4096, "piece_point"), "  spare  n= 4",
        "    every CTA, in order: 0:5.00 1:6.00 2:5.50 3:7.00",
        head.format(65536, "piece_point"), "    every CTA, in order: 0:5.00 1:5.00",
        "=== qkv.tail_point=spare", head.format(4096, "tail_point"),
        "    every CTA, in order: 1:6.50 2:8.50 3:7.25 4:9.00", ""]))
    assert main([str(log), "--previous=qkv.piece_point,qkv.tail_point", "--latest=2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "S=1 contexts=[4096]: qkv.piece_point 5.75, qkv.tail_point 7.88 us (medians over the CTAs that stamp)"
    # CTAs 1..3 stamp both: +0.50, +3.00, +0.25 (medians 5.75 -> 7.88 would say +2.13)
    assert out[1] == "  step qkv.piece_point -> qkv.tail_point: median +0.50  min +0.25  max +3.00"
    # the tail of CTA c against the piece of CTA c - 1: +1.50 +2.50 +1.75 +2.00
    assert out[2] == "  step qkv.piece_point (CTA before) -> qkv.tail_point: median +1.88  min +1.50  max +2.50"
    assert out[3] == "  latest at qkv.tail_point: CTA 4 nan 9.00; CTA 2 5.50 8.50"
    assert out[4].startswith("S=1 contexts=[65536]: qkv.piece_point 5.00 us")  # one run: no step
    other = tmp_path / "other.log"  # a run with a knob besides its stamp: labelled by both
    other.write_text(head.format(4096, "tail_point").replace("}", ", 'scores.keys_prefetch': 0}") +
                     "\n    every CTA, in order: 1:6.00 2:7.00\n")
    assert main([str(log), str(other)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("S=1 contexts=[4096]: qkv.piece_point 5.75, qkv.tail_point scores.keys_prefetch=0 6.50, "
                      "qkv.tail_point 7.88 us (medians over the CTAs that stamp)")
    assert main([str(log), "--previous=qkv.piece_point,qkv.nope"]) == 2
    assert "give two run labels A,B of ['qkv.piece_point', 'qkv.tail_point']" in capsys.readouterr().err
    (tmp_path / "empty.log").write_text("graph replay 12.0 us\n")
    assert main([str(tmp_path / "empty.log")]) == 2 and "timeline_probe.py --by-cta logs?" in capsys.readouterr().err


def test_no_mma_probe_build():
    """--no-mma: the sm90 builds of both kernels compile without any fp8 MMA, wq_b's native wgmma
    included (the f16 ones of MiniMax's scorer stay); a build without the sm90 library's fp8 MMAs
    is refused."""
    import pytest

    from codegen import jit
    from codegen.render import source
    for spec, tokens in (("deepseek_v41/attn_front", 1), ("minimax_m3/pre_attn", 16)):
        ir, src = source(spec, "sm90", tokens=tokens)
        probe = no_mma.without_fp8_mma_source(src)
        assert probe.count("// probe: no MMA") == 4  # the sm90 library's two mma.sync and two wgmma
        before, after = (jit.resource_report(s, f"{ir.name}.{tag}.hip", ir.target)[0] for tag, s in (("a", src), ("b", probe)))
        e4m3 = lambda r: sum(n for op, n in r.mfma.items() if "e4m3" in op)  # noqa: E731
        assert e4m3(before) > 0 and e4m3(after) == 0 and after.spill_store_bytes == 0
        others = lambda r: {op: n for op, n in r.mfma.items() if "e4m3" not in op}  # noqa: E731
        assert others(after) == others(before)
        assert (sum(others(before).values()) > 0) is (spec == "minimax_m3/pre_attn")  # the scorer's f16 MMAs
    with pytest.raises(ValueError, match="not an sm90 build"):
        no_mma.without_fp8_mma_source(source("deepseek_v41/attn_front", "gfx942", tokens=1)[1])


def test_no_key_loads_probe_build():
    """--no-key-loads: MiniMax's scorer reads no keys (key_bytes returns its address's bits, the
    LDS ring's copies are gone) and the build still compiles without spills: sm90 S = 4 (the
    ring), S = 16 (keys in registers) and the CUDA-core dots of gfx942; its GEMV's loads and the
    rest of the source stay as they were; a build with neither function is refused."""
    import pytest

    from codegen import jit
    from codegen.render import source
    for target, tokens, loads, copies in (("sm90", 4, 0, 1), ("sm90", 16, 1, 0), ("gfx942", 16, 1, 0)):
        ir, src = source("minimax_m3/pre_attn", target, tokens=tokens)
        probe = no_key_loads.without_key_loads_source(src)
        assert (probe.count("// probe: no key load\n"), probe.count("// probe: no key copy\n")) == (loads, copies)
        assert "ld16_coherent(p) : ld16(p)" not in probe and "copy16_async(dst + 3 * stride" not in probe
        dropped = [line for line in src.splitlines() if line not in probe.splitlines()]
        assert all("ld16" in line or "copy16_async" in line for line in dropped)  # nothing else went
        (report,) = jit.resource_report(probe, f"{ir.name}.nokeys.hip", ir.target)
        assert report.spill_store_bytes == 0
    with pytest.raises(ValueError, match="not a MiniMax pre_attn build"):
        no_key_loads.without_key_loads_source(source("deepseek_v41/attn_front", "sm90", tokens=1)[1])


def test_heads_twice_probe_build():
    """--heads-twice: each MiniMax head task runs twice from one loop (not unrolled: the second pass
    runs the first's instructions), stamped after the stores (heads.stored_point) and after the
    release fence (heads.fenced_point) in that order; the build compiles without spills, and a
    build without head tasks is refused."""
    import pytest

    from codegen import jit
    from codegen.render import source
    ir, src = source("minimax_m3/pre_attn", "sm90", tokens=1, timeline=True, tune={"heads.stored_point": "spare"})
    probe = heads_twice.heads_twice_source(src)
    assert probe.count("for (int pass = 0; pass < 2; ++pass)") == 1 and "#pragma unroll 1\n" in probe
    heads = probe[probe.index("namespace stage_heads {\n"):probe.index("}  // namespace stage_heads")]
    run = heads[heads.index("MONO_DEVICE void run("):]
    assert run.index("head(a, mb, lds, ht, tk, l32);") < run.index("stamp(lds, TL_SPARE);") < run.index("fence_release();")
    (report,) = jit.resource_report(probe, f"{ir.name}.twice.hip", ir.target)
    assert report.spill_store_bytes == 0
    _, fenced = source("minimax_m3/pre_attn", "sm90", tokens=1, timeline=True, tune={"heads.fenced_point": "spare"})
    run = fenced[fenced.index("namespace stage_heads {\n"):fenced.index("}  // namespace stage_heads")]
    assert run.index("fence_release();") < run.index("stamp(lds, TL_SPARE);") < run.index("barrier();        // ... before")
    with pytest.raises(ValueError, match="not a MiniMax pre_attn build"):
        heads_twice.heads_twice_source(source("deepseek_v41/attn_front", "sm90", tokens=1)[1])
    import codegen
    kernel = codegen.load("minimax_m3/pre_attn", tokens=1, target="sm90", pdl=False)
    twin = heads_twice.heads_twice(kernel)  # Kernel.with_source: the same build, launch modes and all
    assert (twin.ir, twin.backend, twin.cooperative, twin.pdl) == (kernel.ir, kernel.backend, kernel.cooperative, False)
    assert twin.source == heads_twice.heads_twice_source(kernel.source) != kernel.source


def test_heads_last_got_point():
    """heads.last_got_point: every token's first lane stamps, right after its qkv values and after
    thread 0's got_point, into the point's LDS slot by an atomic max (the last of the task's tokens);
    the builds compile without spills on sm90 and gfx950 (an LDS 64-bit atomic max each), and a
    timeline-off build calls a stamp_last that does nothing."""
    from codegen import jit
    from codegen.render import source
    for target in ("sm90", "gfx950"):
        ir, src = source("minimax_m3/pre_attn", target, tokens=16, timeline=True,
                         tune={"heads.last_got_point": "spare"})
        head = src[src.index("namespace stage_heads {\n"):src.index("}  // namespace stage_heads")]
        got = head.index("head_values(mb.qkv + tk * ROWS + off + d0, mb.tag, e);")
        assert got < head.index("stamp(lds, TL_HEAD_GOT_QKV);") < head.index("if (l32 == 0) stamp_last(lds, TL_SPARE);")
        assert head.count("stamp_last(") == 1
        atomic = "atomicMax(reinterpret_cast<unsigned long long*>(p)" if target == "sm90" else "__hip_atomic_fetch_max(p, v"
        assert atomic in src
        (report,) = jit.resource_report(src, f"{ir.name}.last-got.hip", ir.target)
        assert report.spill_store_bytes == 0
    _, off = source("minimax_m3/pre_attn", "sm90", tokens=16, tune={"heads.last_got_point": "spare"})
    assert "MONO_DEVICE void stamp_last(u8*, int) {}" in off and "if (l32 == 0) stamp_last(lds, TL_SPARE);" in off


def test_precision_model():
    """With no block error the modelled wgmma GEMV writes the reference's exact qkv bit for bit;
    with the probe's bound it moves values, each block's error within that bound of its sum |w x|."""
    g = torch.Generator().manual_seed(5)
    x8 = (torch.randn(3, 6144, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(64, 6144, generator=g) * 0.3).to(torch.float8_e4m3fn)
    xs, sw = torch.rand(3, generator=g) * 0.01 + 0.001, torch.rand(64, generator=g) * 0.02 + 0.005
    exact = minimax_m3.qkv_gemv(x8, xs, w, sw)
    assert torch.equal(precision_model.modelled_qkv(x8, xs, w, sw, 0.0, g), exact)
    moved = precision_model.modelled_qkv(x8, xs, w, sw, 1.0, g)
    assert not torch.equal(moved, exact) and int(minimax_m3.bf16_ulp_diff(moved, exact).median()) <= 1
    sums, absdot = torch.ones(4, 8, dtype=torch.float64), torch.full((4, 8), 3.0, dtype=torch.float64)
    err = precision_model.block_errors(sums, absdot, 0.5, g)
    assert bool((err.abs() <= 0.5 * precision_model.PROBE_BOUND * 3.0).all()) and bool((err != 0).any())


# a small sm90 source and its `nvdisasm -gi` listing (code_footprint, ncu_stalls)
FOOTPRINT_SOURCE = "\n".join([
    "MONO_DEVICE u32 helper(u32 w) {",            # 1: a target helper, outside the stages
    "    return w;",                               # 2
    "}",                                           # 3
    "namespace stage_scores {",                    # 4
    "MONO_DEVICE void tile(const Args& a) {",      # 5
    "    helper(1);",                              # 6
    "}",                                           # 7
    "}  // namespace stage_scores",                # 8
    "MONO_KERNEL k(const Args a) {",               # 9
    "    stage_scores::tile(a);",                  # 10
    "}"])                                          # 11
FOOTPRINT_LISTING = "\n".join([
    '\t//## File "k.hip", line 10',
    "        /*0000*/                   S2R R0, SR_TID.X ;",
    '\t//## File "k.hip", line 2 inlined at "k.hip", line 6',
    '\t//## File "k.hip", line 6 inlined at "k.hip", line 10',
    '\t//## File "k.hip", line 10',
    "        /*0010*/                   PRMT R1, R0, 0x9180, RZ ;",
    "        /*0020*/                   LOP3.LUT R1, R1, 0x17f017f, RZ, 0xc0, !PT ;",
    '\t//## File "k.hip", line 11',
    "        /*0030*/                   EXIT ;"])


def test_code_footprint_gives_each_instruction_to_its_stage_and_function():
    """code_footprint: an instruction goes to the innermost line of its inline chain that lies in
    a stage's namespace (a target helper inlined into a stage's function counts for that
    function), the kernel's own lines to `kernel`; an instruction after no `//##` run keeps the
    chain before it."""
    source, listing = FOOTPRINT_SOURCE, FOOTPRINT_LISTING
    assert code_footprint.chains(listing) == [(10,), (2, 6, 10), (2, 6, 10), (11,)]
    per_stage, per_func = code_footprint.footprint(source, listing)
    assert per_stage == {"scores": 2, "kernel": 2}
    assert per_func == {("scores", "tile"): 2, ("kernel", "k"): 2}


def test_ncu_stalls_reads_samples_against_the_listing(tmp_path):
    """ncu_stalls: Nsight Compute's source page (absolute addresses, a stall_* column a reason and
    its `(Not Issued)` twin, which is not counted again) read by offset from the function's first
    instruction, each row given to the stage and function code_footprint gives its instruction."""
    where = ncu_stalls.located(FOOTPRINT_LISTING, FOOTPRINT_SOURCE)
    assert where[0x10] == ("scores", "tile", 6, "PRMT R1, R0, 0x9180, RZ") and where[0x30][:2] == ("kernel", "k")
    head = ['"Address"', '"Source"', '"Instructions Executed"', '"stall_no_inst"', '"stall_barrier"',
            '"stall_no_inst (Not Issued)"']
    rows = [("0x7f0000001000", "S2R R0, SR_TID.X", 512, 3, 0), ("0x7f0000001010", "PRMT R1, R0, 0x9180, RZ", 512, 7, 1),
            ("0x7f0000001020", "LOP3.LUT R1, R1, 0x17f017f, RZ, 0xc0, !PT", 512, 0, 0), ("0x7f0000001030", "EXIT", 512, 0, 9)]
    csv = tmp_path / "case.sass.csv"
    csv.write_text('"Kernel Name","k",\n' + ",".join(head) + "\n" + "\n".join(
        f'"{a}","      {t}","{n}","{i}","{b}","{i}"' for a, t, n, i, b in rows) + "\n")
    got = ncu_stalls.samples(csv)
    assert [r["offset"] for r in got] == [0, 0x10, 0x20, 0x30]
    assert got[1]["reasons"] == {"no_inst": 7, "barrier": 1} and got[1]["sass"] == "PRMT R1, R0, 0x9180, RZ"


def test_compile_offset_probe_sources_and_steps():
    """compile_offset_probe (run on the lent GPU only): its own CUDA kernels compile with nvrtc here,
    and every step its docstring documents is one its parser takes, and the other way round."""
    import re

    from scripts import compile_offset_probe as probe

    for source in (probe.L2_PRIORITY_SRC, probe.SMID_MAP_SRC, probe.ONE_CTA_SRC, probe.LINE_HOMES_SRC):
        assert len(cuda.compile(source, "probe.cu", get_target("sm90"))) > 500
    documented = set(re.findall(r"^  (\w+)(?: \(default\))?: ", probe.__doc__, re.M))
    assert documented == set(probe.STEPS) and "address" in documented, (documented ^ set(probe.STEPS))


def test_line_homes_split_and_letters(monkeypatch):
    """LineHomes (compile_offset_probe --steps address): a line's near SMs are those at or below
    the midpoint of its fastest and slowest SM; each distinct near set gets a letter per kind in
    the order first seen; near_sets gives the atomics' sets. LINE_HOMES_SRC's rows stand in here:
    [smid, then per line atomics, loads cycles]."""
    from scripts import compile_offset_probe as probe

    rows = [[0, 300, 290, 510, 300], [1, 310, 330, 300, 320], [2, 505, 300, 320, 340], [3, 520, 335, 515, 300]]
    monkeypatch.setattr(probe.LineHomes, "cycles", staticmethod(lambda addresses, n: rows))
    homes = probe.LineHomes()
    assert homes.near_sets([0x1000, 0x2000]) == [frozenset({0, 1}), frozenset({1, 2})]
    got = homes([0x1000, 0x2000])
    assert got[0] == "atomics A (310 / 520, 2 near), loads A (300 / 335, 2 near)"
    assert got[1] == "atomics B (320 / 515, 2 near), loads B (300 / 340, 3 near)"
    assert homes([0x1000])[0].startswith("atomics A ")  # the same set, the same letter
