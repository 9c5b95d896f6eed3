"""Rendering: deterministic bytes (in this process and in a fresh one), no
template leftovers, a header that documents the ABI and the scratch layout,
one entry point, each constant once, the timeline only in timeline builds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from codegen.lower import lower, make_build
from codegen.render import render, source
from codegen.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = "minimax_m3/pre_attn"
ENTRY = "minimax_m3_pre_attn"
TARGET_NAMES = ("sm90", "gfx942", "gfx950")
BUILDS = [(t, n, tl) for t in TARGET_NAMES for n in (1, 3, 16) for tl in (False, True)]
IDS = [f"{t}-s{n}-{'tl' if tl else 'notl'}" for t, n, tl in BUILDS]
# builds with every stage (index_heads 4 adds qkv_cp) and the debug build's extra region
EXTRA = [(t, n, False, (("index_heads", 4), ("index_own", 1), ("debug", True), ("signal", True)))
         for t in TARGET_NAMES for n in (1, 4)]
EXTRA_IDS = [f"{t}-s{n}-cp-debug" for t, n, _, _ in EXTRA]
HEAD_MATH = ("DIM", "ROPE", "HALF", "LANES", "ELEMS")  # templates/stages/head_math.j2, in both head-math stages


@lru_cache(maxsize=None)
def built(target: str, tokens: int, timeline: bool, **params):
    loaded = load_spec(SPEC)
    ir = lower(loaded, make_build(loaded, target, tokens=tokens, timeline=timeline, **params))
    return ir, render(ir)


def header(text: str) -> list[str]:
    """The leading comment block (up to the first blank line)."""
    lines = text.split("\n\n", 1)[0].splitlines()
    assert all(line.startswith("//") for line in lines)
    return lines


def declarators(rest: str) -> list[tuple[str, str]]:
    """``(NAME, value)`` of each declarator of ``NAME = value, NAME2 = value2;`` (commas
    inside parentheses belong to a value)."""
    body, depth, parts, cur = rest.split(";", 1)[0], 0, [], ""
    for ch in body:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        name, eq, value = part.partition("=")
        assert eq and re.fullmatch(r"\s*\w+\s*", name), f"not a declarator: {part!r}"
        out.append((name.strip(), value.strip()))
    return out


def constexpr_decls(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """``(type, NAME, value)`` of every ``constexpr T NAME = value[, NAME2 = ...];``
    at namespace level (no indent), by namespace ('' for the top level)."""
    scopes: dict[str, list[tuple[str, str, str]]] = {"": []}
    ns = ""
    for line in text.splitlines():
        m = re.match(r"namespace (\w+) \{$", line)
        if m:
            assert ns == "", f"nested namespace {m.group(1)} in {ns}"
            ns = m.group(1)
            scopes.setdefault(ns, [])
            continue
        if re.match(r"\}\s*// namespace (\w+)$", line):
            assert ns, "namespace closed twice"
            ns = ""
            continue
        m = re.match(r"constexpr ([\w ]+?) (\w+ = .*)$", line)
        if m:
            scopes[ns].extend((m.group(1), name, value) for name, value in declarators(m.group(2)))
    assert ns == "", f"namespace {ns} not closed"
    return scopes


def constexpr_scopes(text: str) -> dict[str, list[str]]:
    """The names of ``constexpr_decls``, by namespace."""
    return {ns: [name for _, name, _ in decls] for ns, decls in constexpr_decls(text).items()}


# ---- determinism ------------------------------------------------------------------------


@pytest.mark.parametrize("build", BUILDS, ids=IDS)
def test_render_twice_same_text(build):
    ir, text = built(*build)
    assert render(ir) == text
    again = lower(load_spec(SPEC), ir.build)
    assert render(again) == text
    _, via_source = source(SPEC, build[0], tokens=build[1], timeline=build[2])
    assert via_source == text
    assert text.endswith("\n") and not text.endswith("\n\n")
    assert not any(line != line.rstrip() for line in text.splitlines())


def test_fresh_process_renders_same_text():
    """A new interpreter (another hash seed, cold caches) gives the same bytes."""
    script = (
        "import json, sys\n"
        "from codegen.render import source\n"
        f"builds = {BUILDS!r}\n"
        "out = {f'{t}/{n}/{tl}': source(%r, t, tokens=n, timeline=tl)[1] for t, n, tl in builds}\n"
        "json.dump(out, sys.stdout)\n"
    ) % SPEC
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    fresh = json.loads(proc.stdout)
    assert set(fresh) == {f"{t}/{n}/{tl}" for t, n, tl in BUILDS}
    for t, n, tl in BUILDS:
        assert fresh[f"{t}/{n}/{tl}"] == built(t, n, tl)[1], f"{t} tokens={n} timeline={tl} differs"


def test_builds_differ():
    texts = {built(*b)[1] for b in BUILDS}
    assert len(texts) == len(BUILDS)


# ---- content ----------------------------------------------------------------------------


@pytest.mark.parametrize("build", BUILDS, ids=IDS)
def test_no_template_leftovers(build):
    target = build[0]
    _, text = built(*build)
    rest = text
    if target == "sm90":  # inline PTX operand lists: "{%0, %1, %2, %3}"
        asm_lines = [ln for ln in text.splitlines() if "{%" in ln]
        assert asm_lines, "the sm90 device library should hold inline PTX"
        for ln in asm_lines:
            assert re.search(r"\{%\d", ln) and ("asm" in ln or ln.lstrip().startswith('"')), ln
        rest = re.sub(r"\{%\d", "", text)
    assert "{%" not in rest and "%}" not in rest
    assert "{#" not in rest and "#}" not in rest
    # C brace initializers ("{{0.0f, ...") are fine; a Jinja expression is not
    assert not re.search(r"\{\{(?![\d{])", rest), re.search(r".*\{\{(?![\d{]).*", rest).group(0)
    assert "Undefined" not in text and "None" not in text


@pytest.mark.parametrize("build", BUILDS, ids=IDS)
def test_header_lists_abi_and_scratch(build):
    ir, text = built(*build)
    head = header(text)
    assert head[0].startswith(f"// {ir.kernel} for {ir.target.name} ")
    assert f"// build:  {ir.build.label()}" in head

    # a shape is [dims] (numbers, or the names of runtime dimensions) or 'scalar'
    abi_rows = [re.match(r"//\s+(\d+)\s+(\w+)\s+(\w+)\s+(\[\w+(?:, \w+)*\]|scalar)\s+(\w+)\s", ln) for ln in head]
    abi_rows = [m.groups() for m in abi_rows if m]
    expected = [
        (str(i), a.name, a.dtype, "scalar" if a.shape is None else "[" + ", ".join(str(d) for d in a.shape) + "]", a.intent)
        for i, a in enumerate(ir.abi, 1)
    ]
    assert abi_rows == expected
    assert len(abi_rows) == 29
    runtime = set(load_spec(SPEC).spec.runtime_dims)
    shapes = {name: shape for _, name, _, shape, _ in abi_rows}
    assert shapes["cos_sin"] == "[max_pos, 64]" and shapes["index_cache"] == "[num_blocks, 128, 128]"
    assert shapes["block_table"] == f"[{ir.build.tokens}, bt_cols]" and shapes["layer"] == "scalar"
    for shape in shapes.values():  # every name in a header shape is a runtime dimension
        assert set(re.findall(r"[A-Za-z_]\w*", shape)) - {"scalar"} <= runtime, shape

    region_rows = [re.match(r"//\s+(\w+)\s+@\s+(\d+)\s+(\d+) B\s+(\d+) (\w+):", ln) for ln in head]
    region_rows = [m.groups() for m in region_rows if m]
    assert region_rows == [(r.name, str(r.offset), str(r.nbytes), str(r.count), r.kind) for r in ir.regions]
    assert any(f"scratch ({ir.scratch_bytes} bytes;" in ln for ln in head)
    # and the kernel points its mailboxes at the same offsets
    for r in ir.regions:
        assert f"mb.{r.name} = reinterpret_cast<{r.c_type}*>(scratch + {r.offset});" in text
    for s in ir.stages:
        assert any(re.match(rf"//\s+{s.index}\. {s.name}\s+{s.kind}\s+{s.tasks} tasks on CTAs {s.first}\.\.", ln)
                   for ln in head), s.name


@pytest.mark.parametrize("build", BUILDS, ids=IDS)
def test_single_extern_c_entry(build):
    ir, text = built(*build)
    assert text.count('extern "C"') == 1
    (define,) = [ln for ln in text.splitlines() if 'extern "C"' in ln]
    assert define.startswith("#define MONO_KERNEL extern \"C\" __global__")
    uses = re.findall(r"^MONO_KERNEL (\w+)\(", text, re.M)
    assert uses == [ENTRY]
    assert text.count("MONO_KERNEL") == 2  # the define and the entry
    # the entry's parameters are the ABI, in order
    params = re.search(rf"^MONO_KERNEL {ENTRY}\((.*?)\)\n\{{", text, re.M | re.S).group(1)
    names = [re.search(r"(\w+)$", p.strip()).group(1) for p in params.split(",")]
    assert names == [a.name for a in ir.abi]


@pytest.mark.parametrize("build", BUILDS + EXTRA, ids=IDS + EXTRA_IDS)
def test_constants_once(build):
    target, tokens, timeline, *extra = build
    ir, text = built(target, tokens, timeline, **dict(*extra))
    decls = constexpr_decls(text)
    scopes = constexpr_scopes(text)
    # within one scope (the top level, or one stage's namespace) a name is declared once
    for ns, declared in scopes.items():
        dupes = sorted({n for n in declared if declared.count(n) > 1})
        assert not dupes, f"declared twice in {ns or 'the top level'}: {dupes}"
    assert set(scopes) == {""} | {f"stage_{s.name}" for s in ir.stages}
    top = {name: (ctype, value) for ctype, name, value in decls[""]}
    for c in ir.constants:
        assert top.get(c.name) == (c.c_type, c.c_value), c
        # the top-level declaration, one line of its own
        top_lines = [ln for ln in text.split("\nnamespace ", 1)[0].splitlines()
                     if re.match(rf"constexpr {c.c_type} {c.name} = {re.escape(c.c_value)};", ln)]
        assert len(top_lines) == 1, c
    # a stage namespace may restate a top-level constant (the head tasks restate K_OFF ..
    # IK_OFF, PAGE16, PAGE_BYTES, SPARSE_BLOCK, STATIC_KV_SCALE; the scorers TOPK_BLOCKS,
    # QKV_ROWS), but only with the same type and value: a name that silently means
    # something else inside a stage is refused, whichever stage it is
    restated = set()
    for ns, declared in decls.items():
        for ctype, name, value in declared if ns else ():
            if name in top:
                assert (ctype, value) == top[name], f"{ns}::{name} = {value} ({ctype}) differs from the top level's {top[name]}"
                restated.add(name)
    assert {"K_OFF", "IK_OFF", "STATIC_KV_SCALE", "TOPK_BLOCKS", "QKV_ROWS"} <= restated  # the check has work to do
    # the shared head math: the same constants, with the same values, in both stages that use it
    math = {ns: {name: (ctype, value) for ctype, name, value in decls[ns] if name in HEAD_MATH}
            for ns in ("stage_heads", "stage_scores")}
    assert set(math["stage_heads"]) == set(HEAD_MATH) and math["stage_heads"] == math["stage_scores"]
    assert math["stage_heads"]["DIM"] == ("int", "128") and math["stage_heads"]["ROPE"] == ("int", "64")


@pytest.mark.parametrize("build", BUILDS, ids=IDS)
def test_lds_names_declared_before_use(build):
    """Every LDS_* name the code reads is declared, and declared above its first use."""
    ir, text = built(*build)
    lines = text.splitlines()
    declared: dict[str, int] = {}
    for n, ln in enumerate(lines):
        m = re.match(r"constexpr int (LDS_\w+) = ", ln)
        if m:
            declared.setdefault(m.group(1), n)
    for n, ln in enumerate(lines):
        if ln.startswith("//") or ln.startswith("constexpr int LDS_"):
            continue
        for name in re.findall(r"\b(LDS_\w+)\b", ln.split("//")[0]):
            assert name in declared, f"line {n + 1}: {name} is not declared"
            assert declared[name] < n, f"line {n + 1}: {name} used before its declaration"
    assert f"constexpr int LDS_BYTES = {ir.lds_bytes};" in text


@pytest.mark.parametrize("kernel", ["minimax_m3/pre_attn", "deepseek_v41/attn_front"])
@pytest.mark.parametrize("target", TARGET_NAMES)
def test_pdl_wait_before_any_memory_access(kernel, target):
    """NVIDIA: the kernel body's first statements (after the Args of the kernel's parameters,
    which reads no memory) let the next launch begin and wait for the previous one
    (programmatic dependent launch, Kernel.pdl), before the epoch or any stamp; a launch that
    reads the epoch early would take a stale one. AMD: no such launch."""
    for tokens in (1, 16):
        ir, text = source(kernel, target, tokens=tokens, timeline=True)
        body = text[text.index(f"MONO_KERNEL {ir.name}("):]
        body = body[body.index("{\n") + 2:]
        if target == "sm90":
            assert body.startswith("    MONO_LDS_DECL(lds, LDS_BYTES);\n"), body[:200]
            lines = [ln for ln in body.splitlines()[1:] if not ln.lstrip().startswith("//")]
            assert lines[0].startswith("    const Args a = {") and lines[0].endswith("};"), lines[:3]
            assert lines[1:3] == ["    launch_dependents();", "    wait_for_previous_launch();"], lines[:4]
            assert text.count("griddepcontrol.wait;") == 1 and text.count("wait_for_previous_launch();") == 1
        else:
            assert "griddepcontrol" not in text and "wait_for_previous_launch" not in text


@pytest.mark.parametrize("build", BUILDS, ids=IDS)
def test_timeline_only_in_timeline_builds(build):
    ir, text = built(*build)
    timeline = build[2]
    assert ("LDS_TL" in text) is timeline
    assert (f"constexpr bool TIMELINE = {'true' if timeline else 'false'};") in text
    if timeline:
        (tl,) = [b for b in ir.lds if b.stage == "kernel"]
        assert f"constexpr int LDS_TL = {tl.offset};" in text
        assert "tl[block_id() * TL_POINTS + thread_id()]" in text
        assert "MONO_DEVICE void stamp(u8* lds, int point)" in text
        assert "MONO_DEVICE void stamp_last(u8* lds, int point)" in text
    else:
        assert "MONO_DEVICE void stamp(u8*, int) {}" in text and "MONO_DEVICE void stamp_last(u8*, int) {}" in text
        assert "tl[" not in text
    for i, p in enumerate(ir.timeline_points):  # the stamp indices exist either way
        assert f"constexpr int TL_{p.upper()} = {i};" in text


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_stage_code_follows_the_build(target):
    _, small = built(target, 1, False)
    _, large = built(target, 16, False)
    # at 1 token the GEMV CTAs normalize inline (into their LDS rows); at 16 the norm stage
    # writes the x8 mailbox
    assert "namespace stage_norm" not in small and "norm_quant_row(a, tk, in[tk], x8 + tk * X8_STRIDE" in small
    assert "norm_quant_row(a, tk, in, mb.x8 + tk * NORM_ROW_WORDS" in large and "stage_norm::run(" not in small
    assert "namespace stage_norm" in large and "(mb.x8s + tid" in large  # waits on the norm's flags
    tile = 8 if target == "gfx942" else 16
    assert f"constexpr int TILE = {tile};" in large
    assert large.count("stage_norm::run(a, mb, lds);") == 1
    assert large.index("stage_norm::run(") < large.index("stage_qkv::run(")
    for text in (small, large):  # the head tasks run after the GEMV, the scorers last, in every build
        for stage in ("qkv", "heads", "scores"):
            assert f"namespace stage_{stage} {{" in text and text.count(f"stage_{stage}::run(a, mb, lds);") == 1
        assert (text.index("stage_qkv::run(a, mb, lds);") < text.index("stage_heads::run(a, mb, lds);")
                < text.index("stage_scores::run(a, mb, lds);"))
        assert "stage_qkv_cp" not in text  # index_heads 1
        # the scorers: sm90 by warp groups, keys through each warp's ring (no batches); AMD
        # one item a CTA barrier, the next item's keys in flight in registers (no ring)
        if target == "sm90":
            assert "constexpr int RING = 2;" in text and not re.search(r"\bBATCH\b", text)
        else:
            assert "constexpr int BATCH = 1;" in text and "RING" not in text
    # four index heads: the context-parallel GEMV runs between qkv and the head tasks
    _, cp = built(target, 4, False, index_heads=4, index_own=1)
    runs = re.findall(r"^\s*stage_(\w+)::run\(a, mb, lds\);", cp, re.M)
    assert runs == ["norm", "qkv", "qkv_cp", "heads", "scores"]


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_head_params_change_the_head_code(target):
    """static_kv_scale and kv_page_stride reach the build constants, the head
    stage's own constants and the header's build line; each build renders apart."""
    base_ir, base = built(target, 4, False)
    ir, text = built(target, 4, False, static_kv_scale=True, kv_page_stride=8)
    assert {"static_kv_scale=True", "kv_page_stride=8"} <= set(header(text)[2].split())
    assert {"static_kv_scale=False", "kv_page_stride=16"} <= set(header(base)[2].split())
    for t, flag, stride in ((base, "false", 16), (text, "true", 8)):
        assert f"constexpr bool STATIC_KV_SCALE = {flag};" in t
        assert f"constexpr int KV_PAGE_STRIDE = {stride};" in t
        heads = t[t.index("namespace stage_heads {"):t.index("}  // namespace stage_heads")]
        assert f"constexpr int PAGE_STRIDE = {stride};" in heads
        assert f"constexpr bool STATIC_KV_SCALE = {flag};" in heads
    assert text != base
    assert text != built(target, 4, False, static_kv_scale=True)[1] != built(target, 4, False, kv_page_stride=8)[1] != base


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemv_part_tiles_are_padded_as_lowering_sizes_them(target):
    """The kernel's PART_ROW (the partial tiles' padded row) is the one the lowering
    sizes the part LDS with; every reader and writer of a tile goes through it."""
    from codegen.stages.gemv_fp8 import part_row
    ir, text = built(target, 16, False)
    row = part_row(ir.target)
    # a column's 16 rows on 16 banks: odd (AMD); or 18, even for 8-byte stores (NVIDIA: 18 x 0..15 mod 32 distinct)
    assert f"constexpr int PART_ROW = {row};" in text and (row % 2 == 1 if ir.target.vendor == "amd" else row == 18)
    part = next(b for b in ir.lds if b.qualified_name == "stage_qkv::LDS_PART")
    assert part.nbytes == (ir.threads // ir.target.wave_size) * 16 * row * 4
    assert not re.search(r"part\[[^\]]*\* 16 \+", text) and "wave * 256" not in text
    if ir.target.vendor == "nvidia":  # put_tile: a lane's column pair in one 8-byte store, the idle half not at all
        put = text[text.index("MONO_DEVICE void put_tile("):]
        put = put[:put.index("\n}\n")]
        assert put.count("*reinterpret_cast<float2*>(part + ") == 2 and "if (j == 1 && !both) break;" in put
        assert "put_tile(part, acc, tokens > 8);" in text and "put_tile(pt, acc, J == 2);" in text


def test_part_row_banks():
    """The bank arithmetic behind sm90's PART_ROW 18 (32 four-byte banks; an 8-byte access in two
    half-warp phases): put_tile's 8-byte stores (lane (g, q): row g or g + 8, column 2q) take 2
    wavefronts a phase, where 17's 4-byte stores took 4 a store; a read down a column (lane r:
    row r, 16 lanes) touches 16 distinct banks."""
    from collections import Counter

    from codegen.stages.gemv_fp8 import PART_ROW

    def ways(words):  # wavefronts of one phase: the most words on one bank
        return max(Counter(w % 32 for w in words).values())

    nv, amd = PART_ROW["nvidia"], PART_ROW["amd"]
    for rows in (0, 8):  # the two 8-byte stores (rows g, g + 8), each two phases of 16 lanes
        for phase in range(2):
            first = [(rows + l // 4) * nv + 2 * (l % 4) for l in range(16 * phase, 16 * phase + 16)]
            assert ways(first + [w + 1 for w in first]) == 2
    assert ways([(l // 4) * amd + 2 * (l % 4) for l in range(32)]) == 4  # 17 on sm90: 4-way 4-byte stores
    assert ways([r * nv for r in range(16)]) == 1 and ways([r * amd for r in range(16)]) == 1
