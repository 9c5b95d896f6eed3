"""The DeepSeek-V4.1 attn_front part of the benchmark harness on the CPU
(``python -m bench.run --dry-run --kernels deepseek``): the bytes of the
floor, the dry run end to end (S = 17: through the xq stage; S = 1 runs in the
guard tests), the plot from its bench.json, and a guard that fails when a
contender is wrong."""

from __future__ import annotations

import json
import subprocess

import pytest

from bench import plot
from bench.deepseek import AttnFrontCase, attn_front_bytes, per_copy_bytes
from bench.case import GuardError
from bench.run import BENCHES, main, parse_args
from codegen.reference import deepseek_v41_unfused as U


def test_bytes():
    b = attn_front_bytes(1)
    assert b["weight"] == 1792 * 5120 + 16 * 512 * 1280 == 19_660_800
    assert b["weight_scales"] == 56 * 160 + 256 * 40 == 19_200
    assert b["floor"] == b["read"] == 19_696_728
    assert [attn_front_bytes(s)["read"] for s in (6, 16, 48)] == [19_762_192, 19_893_248, 20_312_448]
    assert attn_front_bytes(48)["written"] == 48 * (16 * 512 * 2 + 584 + 640 * 4 + 8)
    assert per_copy_bytes(4) == 19_680_000 and per_copy_bytes(2) == 1792 * 5120 + 32 * 512 * 1280 + 8960 + 512 * 40


def test_kernels_option():
    assert parse_args([]).kernels == list(BENCHES) == ["minimax", "deepseek"]
    assert parse_args(["--kernels", "deepseek"]).kernels == ["deepseek"]
    with pytest.raises(SystemExit):
        parse_args(["--kernels", "minimax,nope"])


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-ds")
    rc = main(["--dry-run", "--kernels", "deepseek", "--tokens", "17", "--copies", "2", "--no-jit",
               "--no-generate", "--out", str(out)])
    return rc, out


def test_dry_run(dry_run):
    rc, out = dry_run
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    assert [(c["kernel"], c["tokens"]) for c in data["cases"]] == [("deepseek_v41/attn_front", 17)]
    for c in data["cases"]:
        assert c["guard"] and all(v["ok"] for v in c["guard"].values())
        assert {"ours.contract", "eager.swa_exact", "compile.q_vs_ours", "eager.kt_exact"} <= set(c["guard"])
        assert {"ours_us", "eager_us", "compile_us", "floor_us"} <= set(c)
        # ours over the default 5 workspace places (fake: 0.01 us apart), the median place's in the table;
        # timed again after the others at the allocator's own place, the first (fake: the same)
        places = c["ours_places_us"]
        assert len(places) == 5 and c["ours_us"] == sorted(places)[2] == places[2] != places[0]
        assert c["ours_again_us"] == places[0]
        assert c["floor_us"] == pytest.approx(c["bytes"]["read"] / 4.0e12 * 1e6)
    run = data["kernels"]["deepseek_v41/attn_front"]
    assert run["ok"] and run["meta"]["build"].startswith("TP4, 16 local heads")
    assert data["meta"]["dry_run"] and data["copy_bandwidth"]["fake"]
    entry = (out / "RESULTS-entry.md").read_text()
    assert "## deepseek_v41/attn_front (TP4" in entry and "DRY RUN" in entry and "| 17 |" in entry
    assert "(grid.smem_carveout;" in entry and "S=17 100 %" in entry  # the build's L1 / shared split, named
    assert (out / "RESULTS.md").exists() and (out / "attn_front.png").exists()


def test_plot_from_json(dry_run, tmp_path):
    _, out = dry_run
    assert plot.main([str(out / "bench.json"), "--png-dir", str(tmp_path), "--append-results",
                      str(tmp_path / "R.md")]) == 0
    assert (tmp_path / "attn_front.png").exists()
    assert "deepseek_v41/attn_front" in (tmp_path / "R.md").read_text()


def test_plot_refuses_an_unknown_commit(dry_run, tmp_path, capsys):
    """RESULTS.md entries name a commit of this repository: a run whose commit is not one (the
    lent machine's stale checkout, a hash typed wrong) is refused before anything is appended;
    a "+modified" mark on a real commit is kept."""
    _, out = dry_run
    data = json.loads((out / "bench.json").read_text())
    for run in data["kernels"].values():
        run["meta"]["commit"] = "fd2bac2409c7d58c0ad0cbc65b6d0c1e9f5e7f5c"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert plot.main([str(bad), "--png-dir", str(tmp_path), "--append-results", str(tmp_path / "R.md")]) == 2
    assert not (tmp_path / "R.md").exists()
    assert "is not a commit of this repository" in capsys.readouterr().err
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    for run in data["kernels"].values():
        run["meta"]["commit"] = head + "+modified"
    bad.write_text(json.dumps(data))
    assert plot.main([str(bad), "--png-dir", str(tmp_path), "--append-results", str(tmp_path / "R.md")]) == 0
    assert f"commit `{head}+modified`" in (tmp_path / "R.md").read_text()


def test_guard_catches_wrong_outputs():
    """The guard passes on the reference's values, and fails when our q is a
    few ulps off, when the unfused chain writes a wrong cache byte, or when
    its q is off."""
    case = AttnFrontCase(1, copies=1, dry_run=True)
    assert all(v["ok"] for v in case.guard().values())
    good = case._standin_out["q"].clone()  # the stand-in's outputs exist after the guard
    bad = good.clone()
    r = int(bad[0, 2].float().abs().argmax())
    bad[0, 2, r] = bad[0, 2, r].float() * 1.0625
    case._standin_out["q"] = bad
    with pytest.raises(GuardError, match="ours.contract"):
        case.guard()
    case._standin_out["q"] = good

    def wrong_record(*a, **kw):
        out = U.attn_front_unfused(*a, **kw)
        a[10][7] ^= 0x40  # a byte of the cache (block 0 of swa)
        return out

    case.unfused = wrong_record
    with pytest.raises(GuardError, match="eager.swa_exact") as e:
        case.guard()
    assert "ours.contract" not in str(e.value)

    def wrong_q(*a, **kw):
        out = U.attn_front_unfused(*a, **kw)
        q = out["q"].clone()
        q[0, 5, 100] = q[0, 5, 100].float() * 1.1
        return dict(out, q=q)

    case.unfused = wrong_q
    with pytest.raises(GuardError, match="eager.q"):
        case.guard()


def test_error_in_one_case_keeps_the_others(tmp_path, monkeypatch):
    """An exception in one S is recorded (exit status 1) and the other S still
    run and are reported; also the path without torch.compile."""
    orig = AttnFrontCase.warm_up

    def warm_up(self):
        if self.tokens == 2:
            raise RuntimeError("boom")
        return orig(self)

    monkeypatch.setattr(AttnFrontCase, "warm_up", warm_up)
    rc = main(["--dry-run", "--kernels", "deepseek", "--tokens", "2,1", "--copies", "1", "--no-compile", "--no-jit",
               "--no-generate", "--no-plot", "--out", str(tmp_path)])
    assert rc == 1
    data = json.loads((tmp_path / "bench.json").read_text())
    first, second = data["cases"]
    assert "boom" in first["error"] and first.get("ours_us") is None
    assert second["ours_us"] and second["eager_us"] and "compile_us" not in second
    entry = (tmp_path / "RESULTS-entry.md").read_text()
    assert "S=2: ERROR RuntimeError: boom" in entry and "| 1 |" in entry


def test_ours_timed_again_after_the_others(tmp_path, monkeypatch):
    """Ours is timed a second time after eager and compile, at the allocator's own workspace
    place; a second time more than 3 % off the first at that place becomes a note of the entry,
    with both times (by default, and with --places 1, where that time is the table's)."""
    from bench.timing import FakeTimer, Sample
    for places in (None, 1):
        calls = []

        def graph(self, fns, fake_us=None):
            calls.append(fake_us)
            return Sample([fake_us * (1.1 if len(calls) == n_calls else 1.0)] * self.replays, fake=True)

        n_calls = (5 if places is None else places) + 3  # ours at each place, eager, compile, ours again
        monkeypatch.setattr(FakeTimer, "graph", graph)
        rc = main(["--dry-run", "--kernels", "deepseek", "--tokens", "1", "--copies", "1", "--no-jit", "--no-generate",
                   "--no-plot", "--out", str(tmp_path)] + ([] if places is None else ["--places", str(places)]))
        assert rc == 0 and len(calls) == n_calls and calls[0] == calls[-1]
        case = json.loads((tmp_path / "bench.json").read_text())["cases"][0]
        first = case.get("ours_places_us", [case["ours_us"]])[0]
        assert ("ours_places_us" in case) == (places is None) and first == calls[0]
        assert case["ours_again_us"] == pytest.approx(1.1 * first)
        entry = (tmp_path / "RESULTS-entry.md").read_text()
        assert f"S=1: ours timed again after the other contenders: {case['ours_again_us']:.2f} us " \
               f"(timed first at the same workspace place: {first:.2f})" in entry


def test_ours_over_workspace_places(tmp_path, monkeypatch):
    """--places 3: ours is timed with its workspace at the allocator's own place, then at two
    places in a pool (fresh: counter 0), each a fresh graph; the table's time is the median
    place's, every place's is in the entry, and ours's second timing (after the others) runs on
    its own workspace again, its counter where the first place left it."""
    from bench.timing import FakeTimer, Sample
    seen = []  # (scratch address, the epoch counter's value) at each call of ours
    ours_times = iter([3.0, 1.0, 2.0])

    orig = AttnFrontCase._ours

    def ours(self, i):
        assert self.base_args["scratch"] is self.ws["scratch"] and self.base_args["epoch"] is self.ws["epoch"]
        seen.append((self.ws["scratch"].data_ptr(), int(self.ws["epoch"].view(-1)[0])))
        orig(self, i)

    def graph(self, fns, fake_us=None):
        before = len(seen)
        fns[0]()
        us = next(ours_times, fake_us) if len(seen) > before else fake_us  # ours's places first, then ours again
        return Sample([us] * self.replays, fake=True)

    monkeypatch.setattr(AttnFrontCase, "_ours", ours)
    monkeypatch.setattr(FakeTimer, "graph", graph)
    rc = main(["--dry-run", "--kernels", "deepseek", "--tokens", "1", "--copies", "1", "--places", "3", "--no-jit",
               "--no-generate", "--no-plot", "--no-compile", "--out", str(tmp_path)])
    assert rc == 0
    case = json.loads((tmp_path / "bench.json").read_text())["cases"][0]
    assert case["ours_places_us"] == [3.0, 1.0, 2.0] and case["ours_us"] == 2.0
    (own, n0), (p1, c1), (p2, c2), (again, n_again) = seen[-4:]  # (the guard's call of ours before them)
    assert len({own, p1, p2}) == 3 and (c1, c2) == (0, 0)  # three places, the pool's fresh
    assert again == own and n_again > n0  # back on its own workspace, its counter advanced
    entry = (tmp_path / "RESULTS-entry.md").read_text()
    assert "ours is the median over 3 places of its workspace" in entry
    assert "S=1: ours over 3 workspace places 1.00 / 2.00 / 3.00 us (min / median / max; the allocator's own 3.00)" \
        in entry


def test_place_workspace_refuses_a_short_pool():
    import torch
    case = AttnFrontCase(1, copies=1, dry_run=True)
    pool = torch.empty(case.workspace_bytes() - 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="overruns the .*-byte pool"):
        case.place_workspace(pool)
    case.place_workspace(torch.empty(case.workspace_bytes(), dtype=torch.uint8))
    assert case.ws["scratch"].count_nonzero() == 0 and case.base_args["epoch"] is case.ws["epoch"]
