"""Debug builds (``debug=True``), on the CPU: mailbox waits that give up.

A debug build appends the scratch region ``hang`` (8 words) and renders a
``Tag`` in place of the u32 tag: every ``mailbox_wait(pair, mb.tag)`` /
``mailbox_wait2(pair, mb.tag, ..)`` of the stage templates then resolves to the
bounded overload of kernel.hip.j2 (1 s of ``timer_now()``, ``TIMER_HZ`` from
the device library), which records stage, task, CTA, pair offset and tags; the
same for the sm90 waits on a TMA bulk copy's mbarrier (``bulk_wait(bar, phase,
mb.tag)``).
Release builds render none of it. The handling is spec-generic: every test runs
for MiniMax-M3 pre_attn and DeepSeek-V4.1 attn_front (S=4: the GEMV quantizes
x itself; S=17: the xq stage and its flags). The GPU side is
tests/test_reliability_gpu.py."""

from __future__ import annotations

import re

import pytest
import torch

import codegen
from codegen import jit
from codegen.errors import SpecError
from codegen.launch import KernelHang, describe_hang, hang_record
from codegen.lower import HANG_REGION, lower, make_build
from codegen.render import render, source
from codegen.spec import load_spec, parse_spec
from codegen.spec.load import spec_path
from codegen.targets import TARGETS, get_target

SPEC = "minimax_m3/pre_attn"
DS_SPEC = "deepseek_v41/attn_front"
SPECS = [SPEC, DS_SPEC]
# (spec, build parameters) of the spec-generic tests
BUILDS = [(SPEC, dict(tokens=4)), (DS_SPEC, dict(tokens=4)), (DS_SPEC, dict(tokens=17))]
BUILD_IDS = ["minimax-s4", "deepseek-s4", "deepseek-s17"]


@pytest.mark.parametrize("spec", SPECS)
def test_debug_is_a_bool_parameter_off_by_default(spec):
    p = load_spec(spec).spec.params["debug"]
    assert (p.type, p.default) == ("bool", False)
    assert all(not b.get("debug", False) for b in load_spec(spec).spec.review_builds)


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("spec,build", BUILDS, ids=BUILD_IDS)
def test_debug_layout_appends_the_hang_record(spec, build, target):
    rel, _ = source(spec, target, **build)
    dbg, _ = source(spec, target, debug=True, **build)
    assert [r for r in dbg.regions if r.name != HANG_REGION] == list(rel.regions), "the other regions do not move"
    hang = dbg.region(HANG_REGION)
    assert (hang.kind, hang.count, hang.nbytes) == ("words", 8, 32)
    assert hang.offset >= rel.scratch_bytes and hang.offset % 256 == 0
    assert dbg.scratch_bytes >= hang.offset + hang.nbytes
    assert dbg.arg(dbg.scratch_arg).shape == (dbg.scratch_bytes,)
    assert HANG_REGION not in {r.name for r in rel.regions}


WAIT_CALL = re.compile(r"\bmailbox_wait(?:2|_all2)?(?:<true>)?\(([^;]*)\)")  # acquiring (<true>) or not


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("spec,build", BUILDS, ids=BUILD_IDS)
def test_debug_source(spec, build, target):
    ir, text = source(spec, target, debug=True, **build)
    _, release = source(spec, target, **build)
    for marker in ("struct Tag {", "Tag tag;", "constexpr long long WAIT_TIMEOUT = TIMER_HZ;",
                   f"constexpr int HANG_RECORD = {ir.region(HANG_REGION).offset};", "mb.tag.scratch = scratch;"):
        assert marker in text, marker
        assert marker not in release, marker
    assert "give_up" not in release and "constexpr long long TIMER_HZ" in release
    for s in ir.stages:  # the context of the hang record, set before each stage
        assert f"    mb.tag.stage = {s.index};\n    mb.tag.task = block_id() - stage_{s.name}::FIRST;\n" in text
    # every wait in the stages passes mb.tag itself: the bounded overload (a copy into a u32
    # would pick the unbounded one of the device library)
    stages = text[re.search(r"^// stage \d+:", text, re.M).start():]  # the first stage of the build
    calls = WAIT_CALL.findall(stages)
    assert calls, "the stages wait on mailboxes"
    for args in calls:  # or a helper's `tag` of the deduced type (const TagT& tag: Tag here)
        assert re.search(r",\s*mb\.tag\b", args) or (re.search(r",\s*tag\b", args) and "const TagT& tag" in stages), \
            f"a wait without mb.tag: mailbox_wait({args})"


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("spec,build", BUILDS + [(DS_SPEC, dict(tokens=48))], ids=BUILD_IDS + ["deepseek-s48"])
def test_debug_build_compiles(spec, build, target):
    ir, text = source(spec, target, debug=True, **build)
    reports = jit.resource_report(text, f"{ir.name}.{target}.s{build['tokens']}-debug.hip", get_target(target))
    assert [r.name for r in reports] == [ir.name]
    assert reports[0].spills == 0


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("tokens", (4, 48))
def test_deepseek_tuned_debug_build_compiles(target, tokens):
    """tuned + debug: no spill to memory. (On gfx942 / gfx950 the SGPRs run out,
    106 of 106, and 5 spill into VGPR lanes at S=4 and 48; release builds, tuned
    ones included, spill nothing: tests/test_generated.py.)"""
    ir, text = source(DS_SPEC, target, tokens=tokens, debug=True, tuned=True)
    rep = jit.resource_report(text, f"{ir.name}.{target}.s{tokens}-tuned-debug.hip", get_target(target))[0]
    if target == "sm90":
        assert rep.spills == 0
    else:
        assert (rep.vgpr_spills, rep.scratch_bytes, rep.spill_store_bytes) == (0, 0, 0)
        assert rep.sgpr_spills <= 8, rep


@pytest.mark.parametrize("spec", SPECS)
def test_hang_region_name_is_reserved(spec):
    text = spec_path(spec).read_text()
    anchor = "\nstages:\n"
    assert text.count(anchor) == 1
    text = text.replace(anchor, "\n  - {name: hang, kind: words, count: 8, doc: taken}\n" + anchor.lstrip("\n"), 1)
    loaded = parse_spec(text, "reserved.yaml")
    lower(loaded, make_build(loaded, "sm90", tokens=1))  # release builds may use the name
    with pytest.raises(SpecError, match="'hang' is taken by debug builds"):
        lower(loaded, make_build(loaded, "sm90", tokens=1, debug=True))


def record_words(ir, region: str, entry: int, stage: int, tag: int, seen: int) -> list[int]:
    r = ir.region(region)
    return [2, stage, 3, 17, r.offset + entry * (4 if r.kind == "words" else 8), tag, seen, 5]


def test_hang_record_names_stage_region_and_tags():
    kernel = codegen.launch.load(SPEC, tokens=4, target="sm90", debug=True)
    qkv = next(s for s in kernel.ir.stages if s.kind == "gemv_fp8")
    tag = 7 * 128 + 5 + 1
    rec = hang_record(kernel.ir, record_words(kernel.ir, "x8s", 2, qkv.index, tag, 0))
    assert rec == {"waits": 2, "stage_index": qkv.index, "stage": qkv.name, "kind": "gemv_fp8", "task": 3, "cta": 17,
                   "thread": 5, "offset": kernel.ir.region("x8s").offset + 16, "region": "x8s", "entry": 2,
                   "tag": tag, "seen": 0}
    msg = describe_hang(kernel.ir, rec)
    for part in (f"stage {qkv.index} {qkv.name!r} (gemv_fp8)", "task 3 on CTA 17", "region 'x8s' entry 2",
                 f"tag {tag} (epoch 7, layer 5)", "saw tag 0 (never written)", "outputs are invalid"):
        assert part in msg, (part, msg)
    outside = hang_record(kernel.ir, [1, qkv.index, 2**32 - 1, 0, kernel.ir.scratch_bytes + 64, tag, tag - 128, 0])
    assert outside["region"] is None and outside["task"] == -1
    assert "outside the scratch buffer" in describe_hang(kernel.ir, outside)


def test_check_errors_raises_once_and_clears_the_record():
    kernel = codegen.launch.load(SPEC, tokens=4, target="sm90", debug=True)
    scratch = torch.zeros(kernel.ir.scratch_bytes, dtype=torch.uint8)
    kernel.check_errors(scratch)  # nothing recorded
    hang = kernel.ir.region(HANG_REGION)
    heads = next(s for s in kernel.ir.stages if s.kind == "head_norm_rope")
    words = record_words(kernel.ir, "qkv", 2560 + 7, heads.index, 129 + 5, 5)
    scratch[hang.offset: hang.offset + 32].view(torch.int32).copy_(torch.tensor(words, dtype=torch.int32))
    with pytest.raises(KernelHang, match=r"stage \d+ 'heads' \(head_norm_rope\).*region 'qkv' entry 2567") as e:
        kernel.check_errors(scratch)
    assert e.value.record["region"] == "qkv" and e.value.record["stage"] == "heads"
    assert not scratch[hang.offset: hang.offset + 32].any(), "the record is cleared for the next launch"
    kernel.check_errors(scratch)


def test_release_build_has_nothing_to_check():
    kernel = codegen.launch.load(SPEC, tokens=4, target="sm90")
    assert not kernel.debug
    kernel.check_errors(torch.ones(kernel.ir.scratch_bytes, dtype=torch.uint8))


@pytest.mark.parametrize("spec", SPECS)
def test_generated_files_are_release_builds(spec):
    for rb_text in (render(lower(load_spec(spec), make_build(load_spec(spec), t, **b)))
                    for t in TARGETS for b in load_spec(spec).spec.review_builds):
        assert "struct Tag" not in rb_text


def test_deepseek_hang_record_names_stage_region_and_epoch():
    """The DeepSeek tag has no layer (tag = 2 epoch + 1): the message names the
    epoch only; a wait of wq_b on token 2's QX8 flag (region qrdy, flags)."""
    kernel = codegen.launch.load(DS_SPEC, tokens=4, target="sm90", debug=True)
    assert kernel.debug and kernel.ir.layer_arg is None and kernel.ir.tag_stride == 2
    wq_b = next(s for s in kernel.ir.stages if s.name == "wq_b")
    tag = 2 * 7 + 1
    rec = hang_record(kernel.ir, record_words(kernel.ir, "qrdy", 2, wq_b.index, tag, 2 * 6 + 1))
    assert (rec["stage"], rec["kind"], rec["region"], rec["entry"]) == ("wq_b", "gemv_mxfp8", "qrdy", 2)
    msg = describe_hang(kernel.ir, rec)
    for part in (f"stage {wq_b.index} 'wq_b' (gemv_mxfp8)", "region 'qrdy' entry 2", f"tag {tag} (epoch 7)",
                 "saw tag 13 (epoch 6)", "outputs are invalid"):
        assert part in msg, (part, msg)
    assert "layer" not in msg


def test_deepseek_check_errors_raises_once_and_clears_the_record():
    kernel = codegen.launch.load(DS_SPEC, tokens=17, target="sm90", debug=True)
    scratch = torch.zeros(kernel.ir.scratch_bytes, dtype=torch.uint8)
    kernel.check_errors(scratch)  # nothing recorded
    hang = kernel.ir.region(HANG_REGION)
    assert hang.offset >= kernel.ir.region("qrdy").offset + kernel.ir.region("qrdy").nbytes
    qkv = next(s for s in kernel.ir.stages if s.kind == "mla_norm_rope")
    words = record_words(kernel.ir, "qkvp", 17 * 1792 + 5, qkv.index, 3, 1)  # K half 1 of token 0, row 5
    scratch[hang.offset: hang.offset + 32].view(torch.int32).copy_(torch.tensor(words, dtype=torch.int32))
    with pytest.raises(KernelHang, match=r"stage \d+ 'qkv' \(mla_norm_rope\).*region 'qkvp' entry 30469") as e:
        kernel.check_errors(scratch)
    assert e.value.record["tag"] == 3 and e.value.record["seen"] == 1
    assert not scratch[hang.offset: hang.offset + 32].any(), "the record is cleared for the next launch"
    kernel.check_errors(scratch)


def test_bulk_copy_waits_are_bounded_in_debug_builds():
    """Every wait for a TMA bulk copy (the sm90 builds' mbarriers: DeepSeek's QX8 image at S = 16,
    MiniMax's staged weights at S = 1) takes the launch's tag; a debug build resolves it to a
    bounded wait that fills the hang record (offset BULK_WAIT_AT), a release build to the plain
    one; the launcher's message names the stage and the mbarrier."""
    for spec, tokens in ((DS_SPEC, 16), (SPEC, 1)):
        _, rel_src = source(spec, "sm90", tokens=tokens)
        dbg, dbg_src = source(spec, "sm90", tokens=tokens, debug=True)
        for text in (rel_src, dbg_src):
            calls = re.findall(r"\bbulk_wait\(([^;]*)\);", text[text.index("namespace stage_"):])
            assert calls and all(c.endswith(", mb.tag") for c in calls), calls
        assert "MONO_DEVICE void bulk_wait(u64* bar, u32 phase, u32) { bulk_wait(bar, phase); }" in rel_src
        assert "give_up_at(tag, BULK_WAIT_AT, phase, 0u, deadline)" in dbg_src and "give_up_at" not in rel_src
        rep = jit.resource_report(dbg_src, f"{dbg.name}.sm90.s{tokens}-debug.hip", dbg.target)[0]
        assert rep.spill_store_bytes == 0
    kernel = codegen.launch.load(DS_SPEC, tokens=16, target="sm90", debug=True)
    wq_b = next(s for s in kernel.ir.stages if s.name == "wq_b")
    rec = hang_record(kernel.ir, [1, wq_b.index, 7, 40, 0xFFFFFFFF, 0, 0, 0])
    assert rec["region"] is None and rec["offset"] == codegen.launch.BULK_WAIT_AT
    msg = describe_hang(kernel.ir, rec)
    for part in (f"stage {wq_b.index} 'wq_b' (gemv_mxfp8)", "task 7 on CTA 40", "TMA bulk copy's wait gave up",
                 "mbarrier (phase 0)", "outputs are invalid"):
        assert part in msg, (part, msg)
