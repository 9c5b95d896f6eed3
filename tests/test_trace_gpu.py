"""Timelines on the GPU: a timeline=true build launched by ``codegen.trace``
gives one Perfetto track per CTA with a slice ending at scores_done (every CTA scores) on
every CTA, and a PNG; the trace command does the same from the command line. The
DeepSeek-V4.1 front's timeline builds: every CTA that the IR gives wq_b tasks reaches
wqb_done (all but the qkv CTA in sm90's q_inline builds), and every CTA stages_done.

Order matters here: the generic random-ABI inputs (last test) are the least
known to the kernel, so they run after everything else in this file."""

from __future__ import annotations

import importlib.util
import json

import pytest

from codegen.__main__ import main
from codegen.trace import trace
from tests import deepseek_case as dc
from tests.minimax_case import launch_args, make_inputs

pytestmark = pytest.mark.gpu

SPEC = "minimax_m3/pre_attn"
DS_SPEC = "deepseek_v41/attn_front"
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def case_args(kernel, seed: int) -> dict:
    """The launch the MiniMax GPU tests check against the reference (``--case`` form)."""
    params = dict(kernel.ir.build.params)
    inp = make_inputs(params["tokens"], kernel.target.name, seed, kv_page_stride=params.get("kv_page_stride", 16),
                      index_heads=params.get("index_heads", 1))
    return launch_args(inp, kernel.workspace("cuda"))


def deepseek_case_args(kernel, seed: int) -> dict:
    """The launch the DeepSeek GPU tests check against the reference (``--case`` form)."""
    params = dict(kernel.ir.build.params)
    case = dc.make_case(params["tokens"], params["tp"], params["ratio"], kernel.target.name, seed, swa_block=64,
                        pad_rows=(1,))
    return dc.launch_args(case, kernel.workspace("cuda"))


def check_trace(path, blocks: int, points: list[str], ends: dict[str, set[int]] | None = None) -> None:
    """``ends``: the CTAs that must reach each point (default: scores_done on every CTA)."""
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    tracks = {e["tid"] for e in events if e["name"] == "thread_name"}
    assert tracks == set(range(blocks)), "one track per CTA"
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in slices} <= set(points)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    for end, ctas in (ends or {"scores_done": set(range(blocks))}).items():
        reached = {e["tid"] for e in slices if e["name"] == end}
        assert reached == ctas, f"the CTAs that reach {end}: {sorted(reached ^ ctas)} differ"
    total = max(e["ts"] + e["dur"] for e in slices)
    assert 0 < total < 10_000, f"a launch of {total} us"


@pytest.mark.parametrize("tokens", (1, 4))
def test_trace_of_the_minimax_case(tmp_path, tokens):
    import codegen

    files = trace(SPEC, tmp_path / f"s{tokens}", tokens=tokens, make_args=case_args, png=HAVE_MPL)
    kernel = codegen.load(SPEC, tokens=tokens, timeline=True)
    assert files[0].name == f"s{tokens}.json"
    check_trace(files[0], kernel.ir.blocks, list(kernel.ir.timeline_points))
    if HAVE_MPL:
        assert files[1].name == f"s{tokens}.png" and files[1].stat().st_size > 1000


@pytest.mark.skipif(not HAVE_MPL, reason="the command writes a PNG: needs matplotlib")
def test_trace_command_with_a_case(tmp_path, capsys):
    out = tmp_path / "case"
    assert main(["trace", SPEC, "--tokens", "3", "--case", "tests.test_trace_gpu:case_args", "-o", str(out)]) == 0
    assert f"wrote {out}.json" in capsys.readouterr().out
    assert (tmp_path / "case.png").stat().st_size > 1000


def deepseek_ends(kernel) -> dict[str, set[int]]:
    """wqb_done on the CTAs with wq_b tasks (the IR's placement), stages_done on every CTA."""
    wq_b = next(s for s in kernel.ir.stages if s.name == "wq_b")
    return {"wqb_done": set(range(wq_b.first, wq_b.first + min(wq_b.ctas, wq_b.tasks))),
            "stages_done": set(range(kernel.ir.blocks))}


@pytest.mark.parametrize("tokens,flags", [(1, {}), (17, {}), (48, {"tuned": True, "tp": 2})],
                         ids=["s1", "s17", "s48-tuned-tp2"])
def test_trace_of_the_deepseek_case(tmp_path, tokens, flags):
    import codegen

    files = trace(DS_SPEC, tmp_path / f"ds{tokens}", tokens=tokens, make_args=deepseek_case_args, png=HAVE_MPL,
                  **flags)
    kernel = codegen.load(DS_SPEC, tokens=tokens, timeline=True, **flags)
    assert files[0].name == f"ds{tokens}.json"
    check_trace(files[0], kernel.ir.blocks, list(kernel.ir.timeline_points), deepseek_ends(kernel))
    data = json.loads(files[0].read_text())
    names = {e["name"] for e in data["traceEvents"] if e["ph"] == "X"}
    assert {"kt_done", "wqkv_done", "qkv_done"} <= names, names  # the key table, wqkv units, the S tokens' norms
    assert data["otherData"]["timeline_points"] == list(kernel.ir.timeline_points)
    if HAVE_MPL:
        assert files[1].name == f"ds{tokens}.png" and files[1].stat().st_size > 1000


@pytest.mark.skipif(not HAVE_MPL, reason="the command writes a PNG: needs matplotlib")
def test_trace_command_with_a_deepseek_case(tmp_path, capsys):
    import codegen

    out = tmp_path / "ds-case"
    assert main(["trace", DS_SPEC, "--tokens", "6", "index=true", "--case",
                 "tests.test_trace_gpu:deepseek_case_args", "-o", str(out)]) == 0
    assert f"wrote {out}.json" in capsys.readouterr().out
    kernel = codegen.load(DS_SPEC, tokens=6, index=True, timeline=True)
    check_trace(tmp_path / "ds-case.json", kernel.ir.blocks, list(kernel.ir.timeline_points), deepseek_ends(kernel))
    assert (tmp_path / "ds-case.png").stat().st_size > 1000


@pytest.mark.skipif(not HAVE_MPL, reason="the command writes a PNG: needs matplotlib")
def test_trace_command_random_inputs(tmp_path):
    """The default: random inputs from the ABI alone (runtime dimensions of 1)."""
    import codegen

    out = tmp_path / "random"
    assert main(["trace", SPEC, "--tokens", "2", "-o", str(out)]) == 0
    kernel = codegen.load(SPEC, tokens=2, timeline=True)
    check_trace(tmp_path / "random.json", kernel.ir.blocks, list(kernel.ir.timeline_points))


@pytest.mark.skipif(not HAVE_MPL, reason="the command writes a PNG: needs matplotlib")
def test_trace_command_random_inputs_deepseek(tmp_path):
    """Random DeepSeek inputs: integer tensors are zeros, so every row's slot is 0
    and its record (584 bytes at swa_block 1, swa_stride 584) needs a SWA cache
    of at least 584 bytes: --dim swa_bytes=584 (the default runtime size, 1, is
    too small for the record the kernel writes)."""
    import codegen

    out = tmp_path / "ds-random"
    assert main(["trace", DS_SPEC, "--tokens", "2", "--dim", "swa_bytes=584", "-o", str(out)]) == 0
    kernel = codegen.load(DS_SPEC, tokens=2, timeline=True)
    check_trace(tmp_path / "ds-random.json", kernel.ir.blocks, list(kernel.ir.timeline_points), deepseek_ends(kernel))
