"""scripts/tp_run.py on the CPU: its pure parts (seeds, exactly summable
partials, shards, the cross-rank "every block scored exactly once per head"
check, the shared K/V views), then whole runs over gloo with the reference
in place of the kernels: world size 1 (also with a fault that must fail) and
world size 2 (two processes on loopback: the all-reduce, the cross-rank
coverage of a partial TP group, DeepSeek at TP2)."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codegen.reference import minimax_m3 as mref

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "tp_run.py"
FINAL = re.compile(r"^tp_run: (\d+) passed, (\d+) failed$")


def _load():
    spec = importlib.util.spec_from_file_location("tp_run", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tp_run", mod)
    spec.loader.exec_module(mod)
    return mod


tp = _load()


# ------------------------------------------------------------------ pure parts


def test_seeds_deterministic_and_distinct():
    assert tp.seed_for(7, "partial", 0) == tp.seed_for(7, "partial", 0)
    seeds = {tp.seed_for(7, "partial", r) for r in range(8)} | {tp.seed_for(8, "partial", 0)}
    assert len(seeds) == 9
    assert torch.equal(tp.prev_partial(7, 1, 2), tp.prev_partial(7, 1, 2))
    assert not torch.equal(tp.prev_partial(7, 1, 2), tp.prev_partial(7, 2, 2))


def test_partials_sum_exactly_in_any_order():
    """The all-reduce's order cannot matter: every f32 sum of the partials is
    exact, so NCCL's ring order gives the contract's rank-ordered ar."""
    parts = [tp.prev_partial(3, r, 3) for r in range(8)]
    for p in parts:
        assert p.dtype == torch.bfloat16 and p.abs().max() <= tp.AR_CLAMP
    exact = sum(p.double() for p in parts)
    orders = [list(range(8)), list(reversed(range(8))), [3, 1, 7, 0, 5, 2, 6, 4]]
    for order in orders:
        acc = torch.zeros(3, mref.HIDDEN)
        for r in order:
            acc = acc + parts[r].float()
        assert torch.equal(acc.double(), exact)
    tree = ((parts[0].float() + parts[1].float()) + (parts[2].float() + parts[3].float()))
    assert torch.equal(tree.bfloat16(), tp.rank_ordered_ar(parts[:4]))


def test_shards():
    for heads in (1, 4):
        lay = [tp.shard_layout(r, heads) for r in range(4)]
        assert all(len(x) == 19 + heads for x in lay)
        q = [h for x in lay for k, h in x if k == "q"]
        assert sorted(q) == list(range(64)), "q heads split over the ranks"
        assert [h for k, h in lay[2] if k in ("k", "v")] == [2, 2]
    cp = [[h for k, h in tp.shard_layout(r, 4) if k == "iq"] for r in range(4)]
    assert all(x == [0, 1, 2, 3] for x in cp), "all 4 index-q heads on every rank under CP"
    assert [h for k, h in tp.shard_layout(3, 1) if k == "iq"] == [3]

    w0, s0 = tp.shard_weights(5, 0, 4, "sm90")
    w1, s1 = tp.shard_weights(5, 1, 4, "sm90")
    assert w0.shape == (23 * 128, mref.HIDDEN) and s0.shape == (23 * 128,)
    iq = slice(18 * 128, 23 * 128)  # index q (4 heads) and index k: replicated
    assert torch.equal(w0[iq].view(torch.uint8), w1[iq].view(torch.uint8)) and torch.equal(s0[iq], s1[iq])
    assert not torch.equal(w0[:128].view(torch.uint8), w1[:128].view(torch.uint8))
    w1b, _ = tp.shard_weights(5, 1, 1, "sm90")  # the 1-head shard of rank 1: its index head is global head 1
    assert torch.equal(w1b[18 * 128: 19 * 128].view(torch.uint8), w1[19 * 128: 20 * 128].view(torch.uint8))


# ------------------------------------------------------------------ coverage across ranks


def _index_case(contexts, q_len=1, num_blocks=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = len(contexts) * q_len
    cols = -(-max(contexts) // 128)
    seq = torch.tensor([max(c - (q_len - 1 - i), 1) for c in contexts for i in range(q_len)], dtype=torch.int32)
    table = torch.randint(0, num_blocks, (len(contexts), cols), generator=g, dtype=torch.int32)
    table = table.repeat_interleave(q_len, dim=0)
    cache = (torch.randn(num_blocks, 128, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    iq = torch.randn(s, 4, 128, generator=g).bfloat16().float()
    return iq, cache, table, seq


def _payloads(iq, cache, table, seq, q_len, ranks, init=0, local=1):
    """Each rank's cover from the reference's written mask (not from tp_run's own logic)."""
    out = []
    for r in ranks:
        own = r % 4
        _, written, _ = mref.index_scores(iq, cache, table, seq, q_len, init, local, index_heads=4, index_own=own)
        out.append({"rank": r, "own": own, "cover": tp.decode_iscore(written, seq, q_len, own, 4, init)})
    return out


CONTEXTS = [300 * 128 + 5, 3000, 100, 289 * 128 + 1]  # long (301 blocks), short (24), unscored, long (290)


@pytest.mark.parametrize("init,local", [(0, 1), (1, 2)])
def test_four_ranks_cover_every_block_once(init, local):
    iq, cache, table, seq = _index_case(CONTEXTS, q_len=1)
    pays = _payloads(iq, cache, table, seq, 1, range(4), init, local)
    problems, stats = tp.coverage_problems(pays, seq, 1, init, local, 4)
    assert problems == [] and stats["full_groups"] == 1
    assert stats["long_requests"] == 2 and stats["short_requests"] == 1
    # the union over the ranks, head by head, is exactly [init, n_blk - local) for each long row
    for k, n_blk in ((0, 301), (3, 290)):
        for h in range(4):
            blocks = sorted(b for p in pays for hh, b in p["cover"][k] if hh == h)
            assert blocks == list(range(init, n_blk - local))


def test_coverage_finds_gaps_duplicates_and_extras():
    iq, cache, table, seq = _index_case(CONTEXTS, q_len=1)
    pays = _payloads(iq, cache, table, seq, 1, range(4))

    missing = [dict(p) for p in pays]
    missing[2] = dict(missing[2], cover={k: v[1:] for k, v in missing[2]["cover"].items()})
    problems, _ = tp.coverage_problems(missing, seq, 1, 0, 1, 4)
    assert problems and all("never scored" in x for x in problems)

    dup = [dict(p) for p in pays]
    dup[3] = dict(dup[3], cover=pays[1]["cover"])  # rank 3 scored rank 1's blocks
    problems, _ = tp.coverage_problems(dup, seq, 1, 0, 1, 4)
    assert any("more than once" in x for x in problems) and any("never scored" in x for x in problems)

    extra = [dict(p) for p in pays]
    extra[0] = dict(extra[0], cover=dict(extra[0]["cover"]))
    extra[0]["cover"][0] = extra[0]["cover"][0] + [(0, 300)]  # the pinned local block of a 301-block request
    problems, _ = tp.coverage_problems(extra, seq, 1, 0, 1, 4)
    assert len(problems) == 1 and "not expected" in problems[0]

    problems, _ = tp.coverage_problems(pays[:3] + [None], seq, 1, 0, 1, 4)
    assert any("rank 3" in x for x in problems)


def test_partial_group_covers_its_share():
    """Two ranks of a TP group (world size 2): their residues of the long
    requests' blocks for every head, their own heads of the short ones."""
    iq, cache, table, seq = _index_case(CONTEXTS, q_len=1)
    pays = _payloads(iq, cache, table, seq, 1, range(2))
    problems, stats = tp.coverage_problems(pays, seq, 1, 0, 1, 4)
    assert problems == [] and stats["partial_groups"] == 1
    want = tp.expected_cover(301, [0, 1], True, 0, 1)
    assert want == {(h, b) for h in range(4) for b in range(300) if b % 4 in (0, 1)}
    assert tp.expected_cover(24, [0, 1], False, 0, 1) == {(h, b) for h in (0, 1) for b in range(23)}
    assert tp.expected_cover(16, [0, 1, 2, 3], False, 0, 1) == set()  # 16 blocks: kept whole, unscored


def test_coverage_with_speculative_rows():
    iq, cache, table, seq = _index_case([290 * 128 + 3, 40 * 128], q_len=2)
    pays = _payloads(iq, cache, table, seq, 2, range(4))
    problems, stats = tp.coverage_problems(pays, seq, 2, 0, 1, 4)
    assert problems == [] and stats["long_requests"] == 1 and stats["short_requests"] == 1


# ------------------------------------------------------------------ comparison helpers


def test_merge_shared_views():
    """K and V views of one buffer (V 16 bytes in): the reference writes each
    on its own copy; the merge shows both, as the shared buffer does."""
    buf = torch.full((48,), 7, dtype=torch.uint8)
    k0, v0 = buf[:32].clone(), buf[16:].clone()
    k1, v1 = k0.clone(), v0.clone()
    k1[3] = 1   # a K write
    v1[20] = 2  # a V write at buffer byte 36 (outside the K view)
    v1[5] = 3   # a V write at buffer byte 21 (inside the K view)
    k, v = tp.merge_shared_views(k0, v0, k1, v1, 16)
    want = buf.clone()
    want[3], want[36], want[21] = 1, 2, 3
    assert torch.equal(k, want[:32]) and torch.equal(v, want[16:])
    assert tp.view_offset(buf[:32], buf[16:]) == 16 and tp.view_offset(k0, v0) is None


def test_ulp_check_and_results():
    a = torch.tensor([1.0, 2.0, -3.0]).bfloat16().float()
    one = (a.bfloat16().view(torch.int16) + 1).view(torch.bfloat16).float()
    assert tp.ulp_check(a, a)[0] and tp.ulp_check(one, a, one_ulp_frac=0.99)[0]
    three = (a.bfloat16().view(torch.int16) + 3).view(torch.bfloat16).float()
    assert not tp.ulp_check(three, a)[0]
    res = [tp.Result("0", "m", "a", "pass"), tp.Result("1", "m", "a", "fail", "x"), tp.Result("all", "d", "b", "skip"),
           tp.Result("0", "m", "c", "info")]
    assert tp.counts(res) == (1, 1, 1)
    assert "fail" in tp.table(res).splitlines()[2]


def test_deepseek_skip_when_reference_missing_or_broken(monkeypatch):
    """The DeepSeek part runs only with a working reference: missing, or raising, is a reported skip."""
    from codegen.reference import deepseek_v41 as dref

    assert tp.deepseek_available() == (True, "")

    def broken(*a, **k):
        raise NotImplementedError("not finished")

    monkeypatch.setattr(dref, "attn_front", broken)
    res, dg = tp.run_deepseek(tp.parse(["--ds-tokens", "1"]), 0, 2, torch.device("cpu"), False)
    assert dg is None and [r.status for r in res] == ["skip"] and "NotImplementedError" in res[0].detail
    monkeypatch.delattr(dref, "attn_front")
    ok, why = tp.deepseek_available()
    assert not ok and "attn_front" in why


# ------------------------------------------------------------------ whole runs (gloo, reference path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int, port: int) -> dict:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


def _run(world: int, *args: str, timeout: int = 150) -> list[subprocess.CompletedProcess]:
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=_env(r, world, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def _final(text: str) -> tuple[int, int]:
    m = FINAL.match(text.strip().splitlines()[-1])
    assert m, f"no final line in:\n{text}"
    return int(m.group(1)), int(m.group(2))


def _rows(text: str, check: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if check in line]


def test_world_size_1():
    (r,) = _run(1)
    assert r.returncode == 0, r.stdout + r.stderr
    passed, failed = _final(r.stdout)
    assert failed == 0 and passed >= 8
    assert "world size 1, backend gloo" in r.stdout
    assert "skipped: deepseek" in r.stdout, "DeepSeek at world size 1: a reported skip"
    cover = _rows(r.stdout, "iscore blocks once per head")
    assert cover and cover[0][0] == "all" and "pass" in cover[0]


def test_world_size_1_fault_fails():
    """A rank that leaves one scored block out: both the rank's own check and
    the cross-rank coverage fail, and the run exits non-zero."""
    (r,) = _run(1, "--cp", "--parts", "minimax", "--fault", "iscore")
    assert r.returncode == 1, r.stdout + r.stderr
    passed, failed = _final(r.stdout)
    assert failed == 2
    assert "never scored" in r.stdout
    assert "index_heads=4 own=0 long step=True" in r.stdout


def test_world_size_2():
    """Two gloo processes: the f32 all-reduce gives the rank-ordered ar on both
    ranks, each rank passes against the reference of its own shard, the two
    ranks' iscore pairs cover their half of every long request's blocks
    exactly once per head, and the DeepSeek front runs at TP2 (heads split,
    replicated outputs equal)."""
    r0, r1 = _run(2)
    assert r0.returncode == 0 and r1.returncode == 0, r0.stdout + r0.stderr + r1.stderr
    assert r1.stdout == "", "only rank 0 prints"
    passed, failed = _final(r0.stdout)
    assert failed == 0
    for rank in ("0", "1"):
        ar = [x for x in _rows(r0.stdout, "ar = bf16(rank-ordered") if x[0] == rank]
        assert ar and "pass" in ar[0]
        assert any(x[0] == rank and "own=" + rank in " ".join(x) for x in _rows(r0.stdout, "index_heads=4"))
    cover = _rows(r0.stdout, "iscore blocks once per head")
    assert cover and "pass" in cover[0] and "partial group" in " ".join(cover[0])
    ds = _rows(r0.stdout, "replicated outputs equal across ranks")
    assert ds and "pass" in ds[0], "DeepSeek TP2 ran"
    assert len(_rows(r0.stdout, "shard ref = 64-head ref slice")) == 2
    assert passed >= 2 * 7 + 2 * 2 + 2
