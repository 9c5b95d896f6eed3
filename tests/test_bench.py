"""The benchmark harness on the CPU (``python -m bench.run --dry-run``): every
code path but the timing, the MiniMax K1 cases at the issue's contexts (4K,
64K) with the whole unfused chain, and a guard that fails when a contender is
wrong (qkv, h_out, q_out, a cache byte, an iscore value or a stray iscore
write), and the watchdog that stops a case which never ends."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import report, targets
from bench.case import GuardError
from bench.minimax import PreAttnCase, pre_attn_bytes
from bench.run import auto_copies, main, parse_args
from bench.timing import Watchdog, warm_clocks
from codegen.reference import minimax_m3 as ref
from codegen.reference.minimax_m3_unfused import k1_unfused

ROOT = Path(__file__).resolve().parents[1]


def test_bytes():
    b = pre_attn_bytes(1)  # no context (seq_lens 100): nothing scored
    assert b["weight"] == 2560 * 6144 and b["weight_scales"] == 2560 * 4 and b["index_keys"] == 0
    assert b["head_in"] == 4 * 256 + 128 + 16 and b["score_in"] == 4
    assert b["written"] == 12288 + 2048 * 2 + 128 * 2 + 2 * (128 + 4) + 128
    assert b["floor"] == b["total"] == b["read"] + b["written"] == 15_793_948
    b = pre_attn_bytes(1, 4096)
    assert b["scored_blocks"] == 31 and b["index_keys"] == 31 * 128 * 128 and b["iscore"] == 31 * 8
    assert b["total"] == 16_302_224
    b = pre_attn_bytes(16, 65536)
    assert b["scored_blocks"] == 16 * 511 and b["index_keys"] == 133_955_584 and b["score_in"] == 16 * (511 + 1) * 4
    assert [pre_attn_bytes(s, c)["total"] for c in (4096, 65536) for s in (1, 4, 16)] == [
        16_302_224, 17_952_320, 24_552_704, 24_172_304, 49_432_640, 150_473_984]


def test_auto_copies():
    per_copy = 2560 * 6144 + 2560 * 4
    assert auto_copies(50 << 20, per_copy) == 8
    n = auto_copies(60 << 20, per_copy)
    assert n * per_copy > 2 * (60 << 20)


def test_dry_run(tmp_path):
    out = tmp_path / "out"
    assert main(["--dry-run", "--kernels", "minimax", "--tokens", "1", "--copies", "1", "--no-jit", "--no-generate",
                 "--no-plot", "--out", str(out)]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert [(c["tokens"], c["context"]) for c in data["cases"]] == [(1, 4096), (1, 65536)]
    for c in data["cases"]:
        assert c["guard"] and all(v["ok"] for v in c["guard"].values())
        assert {"ours.heads_exact", "ours.iscore", "eager.heads_exact", "eager.iscore", "eager.q_vs_ours",
                "eager.iscore_vs_ours", "compile.heads_close", "compile.iscore_vs_ours"} <= set(c["guard"])
        assert c["guard"]["eager.iscore"]["written"] == c["bytes"]["scored_blocks"] == c["context"] // 128 - 1
        assert {"ours_us", "eager_us", "compile_us", "floor_us"} <= set(c)
        assert c["floor_us"] == pytest.approx(c["bytes"]["total"] / 4.0e12 * 1e6)
    assert data["meta"]["dry_run"] and data["copy_bandwidth"]["fake"]
    assert not any("not like for like" in n for n in data["kernels"]["minimax_m3/pre_attn"]["meta"]["notes"])
    entry = (out / "RESULTS-entry.md").read_text()
    assert "DRY RUN" in entry and "| 1 | 4K |" in entry and "| 1 | 64K |" in entry and "| S | context |" in entry
    assert "(grid.smem_carveout;" in entry and "S=1 ctx=4096 0 %" in entry  # the L1 / shared split, named
    assert "- issue 5 targets (set on an H200; this run's GPU is not one" in entry  # judged, the fake GPU said
    assert ": 0 of 4 met. Unmet: ours/floor <= 1.3: S=1 4K " in entry
    assert (out / "RESULTS.md").exists()


def test_tune_option(tmp_path):
    """--tune builds our kernel with spec overrides (checked like the spec's values) and names
    them in the run's meta and RESULTS entry; a knob without its stage is refused."""
    out = tmp_path / "out"
    assert main(["--dry-run", "--kernels", "minimax", "--tokens", "1", "--contexts", "4096", "--copies", "1",
                 "--no-generate", "--no-plot", "--out", str(out), "--tune", "scores.tiles_ahead=2"]) == 0
    data = json.loads((out / "bench.json").read_text())
    meta = data["kernels"]["minimax_m3/pre_attn"]["meta"]
    assert meta["tune"] == "scores.tiles_ahead=2" and "tune scores.tiles_ahead=2" in meta["build"]
    assert "(tune scores.tiles_ahead=2) on" in (out / "RESULTS-entry.md").read_text()
    assert "jit" in data["kernels"]["minimax_m3/pre_attn"]  # the JIT timings built the tuned kernel too
    bad = tmp_path / "bad"  # the value reaches the build: its check fails the kernel's run
    assert main(["--dry-run", "--kernels", "minimax", "--tokens", "1", "--contexts", "4096", "--copies", "1",
                 "--no-jit", "--no-generate", "--no-plot", "--out", str(bad), "--tune", "scores.tiles_ahead=9"]) == 1
    cases = json.loads((bad / "bench.json").read_text())["cases"]
    assert any("9 tiles ahead: at most 7" in str(c) for c in cases)
    with pytest.raises(SystemExit):
        main(["--dry-run", "--kernels", "minimax", "--tune", "tiles_ahead=2"])


@pytest.mark.parametrize("flags, build, pdl_note", [([], "", True), (["--no-pdl"], "no PDL", False),
                                                    (["--no-cooperative"], "not cooperative", True)])
def test_launch_options(tmp_path, flags, build, pdl_note):
    """--no-pdl / --no-cooperative name themselves in the build; the PDL note stands exactly when
    ours launches with PDL."""
    out = tmp_path / "out"
    assert main(["--dry-run", "--kernels", "deepseek", "--tokens", "1", "--copies", "1", "--no-jit", "--no-generate",
                 "--no-plot", "--out", str(out), *flags]) == 0
    meta = json.loads((out / "bench.json").read_text())["kernels"]["deepseek_v41/attn_front"]["meta"]
    assert meta["build"].endswith(build)
    assert any("programmatic dependent launch" in n for n in meta["notes"]) is pdl_note


def test_contexts_option():
    assert parse_args([]).contexts == "4096,65536"
    case = PreAttnCase(1, None, copies=1, gemm="dequant", dry_run=True)  # --contexts "": seq_lens 100
    assert case.bytes()["scored_blocks"] == 0
    r = case.guard()
    assert all(v["ok"] for v in r.values()) and r["eager.iscore"]["written"] == 0


@pytest.fixture(scope="module")
def guard_case():
    """S = 2 at a 3K context (23 blocks scored per row): distinct pages, the
    whole chain, one weight copy (no compile contender: the guard's checks of
    ours and eager)."""
    return PreAttnCase(2, 3000, copies=1, gemm="dequant", dry_run=True)


def test_guard_passes():
    torch._dynamo.reset()
    compiled = torch.compile(k1_unfused, backend="eager", dynamic=False)
    r = PreAttnCase(2, 3000, copies=1, gemm="dequant", compiled=compiled, dry_run=True).guard()
    assert all(v["ok"] for v in r.values())
    assert r["ours.iscore"]["written"] == r["eager.iscore"]["written"] == 2 * 23
    assert r["eager.heads_exact"]["exact"] and r["compile.heads_close"]["exact"]
    assert r["compile.iscore_vs_ours"]["written"] == 2 * 23


@pytest.mark.parametrize("what", ["qkv", "h_out", "q_out", "k_cache", "score", "stray"])
def test_guard_catches_wrong_outputs(guard_case, what):
    """The stand-in for our kernel writes a wrong value: a qkv value 8 bf16
    ulps off (on its row's largest value), h_out 1 ulp off, q_out 8 ulps off,
    one K cache byte, one score 1 % off, a pair the contract leaves alone."""
    case = guard_case
    good = case._standin()
    bad = dict(good)
    if what == "qkv":
        q = good["qkv"].clone()
        r = int(q[1].abs().argmax())
        q[1, r] = (q[1, r] * 1.0625).bfloat16().float()
        bad["qkv"] = q
    elif what == "h_out":
        bad["h_out"] = good["h_out"].clone()
        bad["h_out"].view(torch.int16)[0, 7] += 1
    elif what == "q_out":
        bad["q_out"] = good["q_out"].clone()
        i = int(bad["q_out"][1].float().abs().argmax())
        bad["q_out"][1, i] = bad["q_out"][1, i] * 1.0625
    elif what == "k_cache":
        bad["k_cache"] = good["k_cache"].clone()
        slot = int(case.cpu["slot_mapping"][0])
        page = int(ref.page16_of(torch.tensor(slot), 16))
        bad["k_cache"].view(torch.uint8).view(-1, 2048)[page, (slot % 16) * 16 + 3] ^= 0x10  # token 0's dim 3
    elif what == "score":
        s = good["scores"].clone()
        b = int(good["written"][0].nonzero()[3])
        s[0, b] *= 1.01
        bad["scores"] = s
    else:
        w = good["written"].clone()
        w[1, 5000] = True  # a block no row scores
        bad["written"], bad["scores"] = w, good["scores"].nan_to_num(0.0)
    names = {"qkv": "qkv", "h_out": "h_out", "q_out": "ours.heads", "k_cache": "ours.heads", "score": "ours.iscore",
             "stray": "ours.iscore"}
    case._standin_want = bad
    try:
        with pytest.raises(GuardError, match=names[what]):
            case.guard()
    finally:
        case._standin_want = good


def test_table_without_compile():
    rows = [{"tokens": 1, "ours_us": 8.0, "eager_us": 40.0, "compile_us": None, "floor_us": 4.0}]
    text = report.format_table(rows)
    assert "n/a" in text and "2.00" in text and "context" not in text
    assert report.markdown_table(rows).count("|") > 10


def test_table_and_plot_with_contexts(tmp_path):
    rows = [{"tokens": s, "context": c, "ours_us": 8.0 * s, "eager_us": 40.0, "compile_us": 20.0, "floor_us": 4.0}
            for c in (4096, 65536) for s in (1, 4)]
    md = report.markdown_table(rows)
    assert md.splitlines()[0].startswith("| S | context | ours us") and "| 4 | 64K | 32.00 |" in md
    assert "64K" in report.format_table(rows)
    pytest.importorskip("matplotlib")
    assert report.plot(rows, tmp_path / "p.png", "t") is None and (tmp_path / "p.png").stat().st_size > 0


def test_targets_judged_on_the_issues_cases():
    """Issue 5's targets: MiniMax ours/floor at S = 1 (<= 1.3) and 16 (<= 1.6) at both contexts,
    compile/ours >= 10 everywhere; a row without a context (the GPU tests' launch) is none of the
    issue's cases; an unmeasured ratio is not met; the JIT and make generate by their times;
    DeepSeek judged at TP4 only (<= 1.4 up to S = 16, <= 2 at 48, compile/ours >= 8)."""
    mm = {"kernel": "minimax_m3/pre_attn", "gpu": "NVIDIA H200", "build": ""}
    rows = [{"tokens": 1, "context": 4096, "ours_us": 5.0, "floor_us": 4.0, "compile_us": 60.0},  # 1.25, 12
            {"tokens": 16, "context": 65536, "ours_us": 50.0, "floor_us": 30.0, "compile_us": 200.0},  # 1.67, 4
            {"tokens": 4, "context": 4096, "ours_us": 9.0, "floor_us": 4.0, "compile_us": None},
            {"tokens": 1, "context": None, "ours_us": 99.0, "floor_us": 4.0, "compile_us": 1.0}]
    extras = {"jit": {"cold_compile_s": 2.5, "warm_cache_s": 0.01}, "generate": {"wall_s": 3.0}}
    got = [(v.label, v.tokens, v.context, v.met) for v in targets.judge(mm, rows, extras)]
    assert got == [("ours/floor", 1, 4096, True), ("ours/floor", 16, 65536, False),
                   ("compile/ours", 1, 4096, True), ("compile/ours", 16, 65536, False),
                   ("compile/ours", 4, 4096, False), ("JIT cold compile s", None, None, False),
                   ("JIT warm cache load s", None, None, True), ("make generate s", None, None, True)]
    note = report.targets_note(mm, rows, extras)
    assert note.startswith("issue 5 targets (set on an H200): 4 of 8 met. Unmet: ours/floor <= 1.6: S=16 64K 1.67;")
    assert "Not measured: compile/ours >= 10: S=4 4K n/a." in note and "Met: ours/floor <= 1.3: S=1 4K 1.25;" in note
    assert "this run's GPU is not one" in report.targets_note({**mm, "gpu": "NVIDIA H100 80GB HBM3"}, rows, {})
    assert report.targets_note(mm, [rows[-1]], {}) is None
    ds = {"kernel": "deepseek_v41/attn_front", "gpu": "NVIDIA H200", "build": "TP4, 16 local heads, ratio 1"}
    rows = [{"tokens": s, "ours_us": us, "floor_us": 4.0, "compile_us": 80.0} for s, us in ((16, 5.6), (48, 8.4))]
    assert [(v.label, v.bound, v.met) for v in targets.judge(ds, rows, {})] == [
        ("ours/floor", 1.4, True), ("ours/floor", 2.0, False), ("compile/ours", 8.0, True),
        ("compile/ours", 8.0, True)]
    assert targets.judge({**ds, "build": "TP2, 32 local heads, ratio 1"}, rows, {}) == []


def test_targets_of_the_results_entries(tmp_path, capsys):
    """python -m bench.targets reads RESULTS.md's entries back (header, commit, table, JIT and
    make generate notes; dry runs left out) and judges them as the bench does: the H200 entries
    at dbfd29b meet MiniMax's S = 16 / 64K ratio alone (1.42) and none of DeepSeek's."""
    entries = targets.results_entries((ROOT / "bench" / "RESULTS.md").read_text())
    at = {(m["kernel"], m["gpu"]): (m, rows, extras) for m, rows, extras in entries
          if m.get("commit", "").startswith("dbfd29b")}
    mm, rows, extras = at[("minimax_m3/pre_attn", "NVIDIA H200")]
    assert mm["date"] == "2026-12-03 20:27 UTC" and len(rows) == 6 and extras["jit"]["warm_cache_s"] == 0.002
    assert rows[0] == {"tokens": 1, "context": 4096, "ours_us": 11.16, "compile_us": 51.83, "floor_us": 3.83,
                       "ours/floor": 2.92, "compile/ours": 4.64}
    met = [(v.label, v.tokens, v.context, v.value) for v in targets.judge(mm, rows, extras) if v.met and v.tokens]
    assert met == [("ours/floor", 16, 65536, 1.42)]
    ds = at[("deepseek_v41/attn_front", "NVIDIA H200")]
    assert ds[0]["build"] == "TP4, 16 local heads, ratio 1"
    assert not any(v.met for v in targets.judge(*ds) if v.tokens)
    common = {**mm, "torch": "t", "target": "sm90", "copies": 9, "l2_bytes": 1 << 26, "replays": 50, "gemm": "g"}
    text = (report.markdown_entry({**common, "commit": "abc", "dry_run": True}, rows, {})  # a dry run: left out
            + report.markdown_entry({**common, "commit": "def"}, rows[:2], {"generate": {"wall_s": 2.5}}))
    (tmp_path / "R.md").write_text(text)
    (only,) = targets.results_entries(text)
    assert only[0]["commit"] == "def" and len(only[1]) == 2 and only[2] == {"generate": {"wall_s": 2.5}}
    assert targets.main([str(tmp_path / "R.md")]) == 0
    out = capsys.readouterr().out
    assert "commit def:" in out and ": 1 of 4 met." in out and "Met: make generate s <= 10: 2.50" in out


def test_watchdog_lets_a_step_in_time_pass():
    fired = []
    dog = Watchdog(5.0, on_fire=fired.append)
    with dog.step("quick"):
        pass
    with Watchdog(0).step("no limit"):  # 0: off
        pass
    assert fired == []


def test_watchdog_stops_a_step_that_never_ends(tmp_path):
    """A step past its limit (here a sleep with the GIL released, as a CUDA synchronize on a
    kernel that never ends): the process exits with status 3 after on_fire ran, and says what
    ran and where the debug build helps."""
    marker = tmp_path / "fired.txt"
    code = (
        "import time, pathlib\n"
        "from bench.timing import Watchdog\n"
        f"dog = Watchdog(0.3, on_fire=lambda msg: pathlib.Path({str(marker)!r}).write_text(msg))\n"
        "with dog.step('deepseek S=16'):\n"
        "    time.sleep(30)\n"
        "print('not reached')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=25,
                          cwd=str(ROOT))
    assert proc.returncode == Watchdog.EXIT_STATUS == 3
    assert "not reached" not in proc.stdout
    assert "deepseek S=16 still running after 0.3 s" in proc.stderr and "debug=True" in proc.stderr
    assert marker.read_text().startswith("bench: deepseek S=16 still running")


def test_warm_clocks_runs_launches_for_the_time_asked():
    """warm_clocks launches in batches of 32, a sync after each, until the time asked has
    passed, and passes each launch its index (the timeline scripts rotate weights by it)."""
    seen, syncs = [], []
    began = time.perf_counter()
    n = warm_clocks(seen.append, seconds=0.02, sync=lambda: (syncs.append(len(seen)), time.sleep(0.002)))
    assert time.perf_counter() - began >= 0.02
    assert n == len(seen) and seen == list(range(n)) and n % 32 == 0 and n >= 32
    assert syncs == list(range(32, n + 1, 32))
