"""Timeline conversion on synthetic stamps (CPU): slices between consecutive
reached points, the Chrome/Perfetto trace, the PNG; and the trace command's
clear refusal where there is no GPU."""

from __future__ import annotations

import json

import pytest
import torch

from codegen.__main__ import main
from codegen.trace import TICK_NS, Slice, chrome_trace, plot_timeline, slices

POINTS = ["start", "sums_reduced", "x8_ready", "gemv_done", "stages_done"]
T0 = 1_000_000  # timers do not start at 0


def stamps() -> torch.Tensor:
    """3 CTAs: CTA 0 runs a norm task and a GEMV task, CTA 1 only a GEMV task,
    CTA 2 did not get past start."""
    tl = torch.zeros(3, len(POINTS), dtype=torch.int64)
    tl[0] = torch.tensor([T0 + 10, T0 + 210, T0 + 260, T0 + 900, T0 + 950])
    tl[1] = torch.tensor([T0, 0, 0, T0 + 800, T0 + 820])
    tl[2, 0] = T0 + 5
    return tl


def test_slices():
    got = slices(stamps(), POINTS)
    assert got == [
        Slice(0, "sums_reduced", "start", 10.0, 200.0),
        Slice(0, "x8_ready", "sums_reduced", 210.0, 50.0),
        Slice(0, "gemv_done", "x8_ready", 260.0, 640.0),
        Slice(0, "stages_done", "gemv_done", 900.0, 50.0),
        Slice(1, "gemv_done", "start", 0.0, 800.0),  # the skipped points make no slice
        Slice(1, "stages_done", "gemv_done", 800.0, 20.0),
    ]


def test_slices_scale_and_order():
    """AMD ticks are 10 ns; a point stamped out of list order still gives
    non-negative slices, in time order."""
    tl = stamps()
    got = slices(tl, POINTS, TICK_NS["amd"])
    assert got[0] == Slice(0, "sums_reduced", "start", 100.0, 2000.0)
    tl[0, 1] = T0 + 950 + 30  # sums_reduced after stages_done (a later task's stamp)
    names = [s.name for s in slices(tl, POINTS) if s.cta == 0]
    assert names == ["x8_ready", "gemv_done", "stages_done", "sums_reduced"]
    assert all(s.dur_ns >= 0 for s in slices(tl, POINTS))


def test_slices_edge_cases():
    assert slices(torch.zeros(4, 5, dtype=torch.int64), POINTS) == []
    assert slices([[5, 0, 0, 0, 9]], POINTS) == [Slice(0, "stages_done", "start", 0.0, 4.0)]
    with pytest.raises(ValueError, match="5 timeline points"):
        slices(torch.zeros(2, 4, dtype=torch.int64), POINTS)


def test_chrome_trace():
    trace = json.loads(json.dumps(chrome_trace(stamps(), POINTS, 1.0, "k sm90 tokens=4")))
    events = trace["traceEvents"]
    names = {(e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert names == {(0, "CTA 0"), (1, "CTA 1"), (2, "CTA 2")}, "one track per CTA"
    assert [e for e in events if e["name"] == "process_name"][0]["args"]["name"] == "k sm90 tokens=4"
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == 6
    first = xs[0]
    assert (first["tid"], first["name"], first["ts"], first["dur"]) == (0, "sums_reduced", 0.01, 0.2)  # us
    assert first["args"] == {"from": "start", "to": "sums_reduced", "dur_ns": 200.0}
    assert trace["otherData"]["timeline_points"] == POINTS and trace["displayTimeUnit"] == "ns"


def test_plot_timeline(tmp_path):
    pytest.importorskip("matplotlib")
    g = torch.Generator().manual_seed(0)
    tl = torch.zeros(132, len(POINTS), dtype=torch.int64)
    tl[:, 0] = T0 + torch.randint(0, 500, (132,), generator=g)
    tl[:, 3] = T0 + 8000 + torch.randint(0, 3000, (132,), generator=g)
    tl[:, 4] = tl[:, 3] + 500
    path = plot_timeline(tl, POINTS, tmp_path / "tl.png", 1.0, "synthetic")
    assert path.exists() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no GPU")
def test_trace_command_needs_a_gpu(capsys, tmp_path):
    assert main(["trace", "minimax_m3/pre_attn", "--tokens", "4", "-o", str(tmp_path / "t")]) == 1
    err = capsys.readouterr().err
    assert "needs a GPU" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())
