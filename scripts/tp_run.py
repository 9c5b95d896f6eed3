#!/usr/bin/env python3
"""Tensor-parallel run of the kernels on several GPUs with NCCL (or, without a
GPU, of the PyTorch reference in their place over gloo: the plumbing).

    torchrun --nproc-per-node 4 scripts/tp_run.py      # 4 GPUs, TP4
    python scripts/tp_run.py                            # world size 1

Per rank r of W (rank r is TP rank ``r % 4`` of TP group ``r // 4``):

* MiniMax-M3 K1 (``minimax_m3/pre_attn``, contract A): the rank holds a
  previous-layer partial (random, seeded by rank) and all-reduces the partials
  (f32 sum, ``torch.distributed.all_reduce``) into ``ar`` = bf16 of the sum.
  The contract's ``ar`` is bf16 of the RANK-ORDERED f32 sum; NCCL's ring does
  not add in rank order, so the partials are drawn on a 2^-16 grid with
  ``|p| <= 4`` (bf16 values whose f32 sums are exact in any order): the
  all-reduced ``ar`` then equals the contract's bit for bit, and every rank
  checks that against the rank-ordered sum of all ranks' partials, which it
  regenerates from the seeds. The rank then runs the kernel
  (``index_heads`` 4 when W > 1 or ``--cp``, ``index_own = r % 4``) on its own
  shard of the layer's qkv projection (q heads 16 t..16 t + 15, kv head t, the
  4 index-q heads (replicated) or index head t, index k (replicated); each
  128-row head drawn from its own seed, so any rank can rebuild any shard),
  with long contexts (> 288 blocks) so that indexer context parallelism
  engages. Each rank's outputs are compared with the single-process reference
  of its shard, built from the seeds alone: h_out and x8 / x_scale exactly,
  qkv within 2 bf16 ulp (1 ulp on >= 99.9 %) given the kernel's own x8, q /
  index q / every cache byte and scale exactly given the kernel's qkv, the
  iscore pairs (which pairs were written, values within the f32-accumulation
  bound, untouched bytes). Then the ranks' iscore pairs are gathered: within
  each TP group every (index head, block) of every scored request must be
  scored exactly once (long requests: rank t scores blocks first_own + 4 i
  for all 4 heads, so the union over 4 ranks is [init, n_blk - local) per
  head, disjoint; short requests: each rank its own head). A partial group
  (W = 2) must cover exactly its ranks' share.
* DeepSeek-V4.1 attn_front (``deepseek_v41/attn_front``, contract B) at
  tp = W (2 or 4; other world sizes: a reported skip): x, wqkv and the norms
  replicated, wq_b sharded by heads (rank r: heads r H .. r H + H - 1 of 64).
  Per rank the kernel against the reference given its own intermediates
  (``tests/deepseek_case.check``), the shard's reference against the
  single-process 64-head reference (exact), the kernel's q against the
  64-head reference (reported); across ranks the replicated outputs (wqkv
  partials, QX8, key table, SWA records) must be identical. Skipped, and
  reported as such, when ``codegen.reference.deepseek_v41.attn_front`` is
  missing or raises.

Without a GPU each rank runs the reference "simulation" of the kernels
(``simulate_minimax``, ``tests/deepseek_case.simulate``), writing the same
buffers (mailboxes with their tags, caches, iscore pairs) that the same
checks then read back. Rank 0 prints a table and ``tp_run: N passed, M
failed``; every rank exits non-zero on a failure."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import socket
import sys
import traceback
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import codegen  # noqa: E402
from codegen.fp import bf16_rn  # noqa: E402
from codegen.reference import minimax_m3 as mref  # noqa: E402
from codegen.targets import get_target  # noqa: E402
from tests import minimax_case as mc  # noqa: E402
from tests.launch_guard import launch_and_wait  # noqa: E402

TP = 4  # MiniMax-M3: TP4 ranks, 4 index heads under context parallelism
HIDDEN = mref.HIDDEN
HEAD_DIM = mref.HEAD_DIM
Q_HEADS = mref.LOCAL_Q_HEADS
INDEX_HEADS_CP = 4
IQ_BASE = (Q_HEADS + 2) * HEAD_DIM  # first index-q row of a token's qkv
ISCORE_STRIDE = mref.ISCORE_STRIDE
CANARY = 0x5A
AR_GRID = 2.0**-16  # partials on this grid, |p| <= AR_CLAMP: f32 sums exact in any order
AR_CLAMP = 4.0
DEFAULT_CONTEXTS = (65536, 3000, 40000, 100)  # 512 / 24 / 313 / 1 blocks: long, short, long, unscored
INDEX_BLOCKS = 1024  # index-cache blocks of the MiniMax case
HANG_S = 120.0


# ---------------------------------------------------------------------------------- results


@dataclass
class Result:
    rank: str  # "0", "1", ... or "all" / "g0" for cross-rank checks
    part: str
    check: str
    status: str  # pass | fail | skip | info
    detail: str = ""


def outcome(ok: bool) -> str:
    return "pass" if ok else "fail"


def counts(results: list[Result]) -> tuple[int, int, int]:
    """(passed, failed, skipped) of a list of results; "info" rows count for nothing."""
    c = Counter(r.status for r in results)
    return c["pass"], c["fail"], c["skip"]


def table(results: list[Result]) -> str:
    head = ("rank", "part", "check", "result", "detail")
    rows = [head] + [(r.rank, r.part, r.check, r.status, r.detail) for r in results]
    w = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(row[i].ljust(w[i]) for i in range(4)) + "  " + row[4] for row in rows).rstrip()


# ---------------------------------------------------------------------------------- seeding


def seed_for(base: int, *keys) -> int:
    """A deterministic 31-bit seed for ``keys`` under the run's seed ``base``
    (crc32 of the repr: the same in every process, unlike ``hash``)."""
    return zlib.crc32(repr((int(base),) + tuple(keys)).encode()) & 0x7FFFFFFF


def tp_rank(rank: int) -> int:
    return rank % TP


def tp_group(rank: int) -> int:
    return rank // TP


def index_heads_for(world: int, cp: bool) -> int:
    """4 index-q heads (indexer context parallelism) when several ranks run or ``--cp``."""
    return INDEX_HEADS_CP if (world > 1 or cp) else 1


# ---------------------------------------------------------------------------------- all-reduce


def prev_partial(seed: int, rank: int, tokens: int) -> torch.Tensor:
    """Rank ``rank``'s previous-layer partial, bf16 ``[tokens, 6144]``: bf16 of
    N(0, 0.5^2), clamped to +-4, snapped to the 2^-16 grid (values below 2^-9
    round to a multiple of 2^-16 with <= 7 significant bits: still bf16).
    Sums of up to 2^7 such partials are exact in f32 in any order."""
    g = torch.Generator().manual_seed(seed_for(seed, "partial", rank))
    p = (torch.randn(tokens, HIDDEN, generator=g) * 0.5).clamp(-AR_CLAMP, AR_CLAMP)
    p = torch.round(p.bfloat16().float() / AR_GRID) * AR_GRID
    out = p.bfloat16()
    assert torch.equal(out.float(), p), "partial not bf16-representable"
    return out


def rank_ordered_ar(partials: list[torch.Tensor]) -> torch.Tensor:
    """The contract's ``ar``: bf16 of ``((p0 + p1) + p2) + ...`` in f32."""
    acc = torch.zeros(partials[0].shape, dtype=torch.float32)
    for p in partials:
        acc = acc + p.float()
    return acc.bfloat16()


def all_reduce_ar(partial: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The all-reduce: f32 sum over the ranks (``torch.distributed.all_reduce``), then bf16."""
    t = partial.float().to(device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.to(torch.bfloat16)


# ---------------------------------------------------------------------------------- MiniMax shard


def shard_layout(trank: int, index_heads: int) -> list[tuple[str, int]]:
    """(kind, global head) of each 128-row block of TP rank ``trank``'s fused
    projection, in the qkv row order q(16) | k | v | index q (4 or 1) | index k.
    Global heads: q 0..63, kv 0..3, index q 0..3 (all four on every rank under
    context parallelism, head ``trank`` otherwise), index k 0 (replicated)."""
    iq = range(INDEX_HEADS_CP) if index_heads == INDEX_HEADS_CP else [trank]
    return ([("q", Q_HEADS * trank + j) for j in range(Q_HEADS)] + [("k", trank), ("v", trank)]
            + [("iq", h) for h in iq] + [("ik", 0)])


def head_rows(seed: int, kind: str, head: int, target) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's 128 rows of the layer's qkv weight (logical fp8) and scales."""
    t = get_target(target) if isinstance(target, str) else target
    g = torch.Generator().manual_seed(seed_for(seed, "w_qkv", kind, head))
    w = (torch.randn(HEAD_DIM, HIDDEN, generator=g) * 0.3).clamp(-t.fp8_max, t.fp8_max)
    s = torch.rand(HEAD_DIM, generator=g) * 0.02 + 0.005
    return w.to(getattr(torch, t.torch_fp8_dtype_name)), s


def shard_weights(seed: int, trank: int, index_heads: int, target) -> tuple[torch.Tensor, torch.Tensor]:
    """TP rank ``trank``'s ``w_qkv [(19 + index_heads) * 128, 6144]`` (logical
    fp8) and ``s_qkv``, assembled head by head from the layer's seeds."""
    parts = [head_rows(seed, kind, h, target) for kind, h in shard_layout(trank, index_heads)]
    return torch.cat([w for w, _ in parts]), torch.cat([s for _, s in parts])


def minimax_inputs(seed: int, trank: int, tokens: int, target: str, index_heads: int, ar: torch.Tensor) -> dict:
    """The host inputs of one rank's launch: everything but the weight shard
    and ``ar`` is replicated (the same seed on every rank)."""
    inp = mc.make_inputs(tokens, target, seed=seed_for(seed, "minimax"), index_heads=index_heads)
    inp["w"], inp["s_qkv"] = shard_weights(seed, trank, index_heads, target)
    inp["ar"] = ar.cpu()
    return inp


def minimax_contexts(seed: int, tokens: int, q_len: int, contexts) -> dict:
    return mc.context_case(tokens, q_len, list(contexts), seed=seed_for(seed, "contexts"), num_blocks=INDEX_BLOCKS)


def request_blocks(seq_last: int) -> int:
    return -(-max(int(seq_last), 1) // mref.SPARSE_BLOCK)


def is_long(n_blk: int, index_heads: int) -> bool:
    return index_heads > 1 and n_blk > mref.INDEX_CP_FROM_BLOCKS


def long_step(seq_lens: torch.Tensor, q_len: int, index_heads: int) -> bool:
    s = seq_lens.shape[0]
    return any(is_long(request_blocks(seq_lens[r * q_len + q_len - 1]), index_heads) for r in range(s // q_len))


def fresh_rows(rows: int, index_heads: int, own: int, long: bool) -> torch.Tensor:
    """The qkv rows a launch writes: all, except the other ranks' index-q heads
    in a step without a long request (4-head builds)."""
    fresh = torch.ones(rows, dtype=torch.bool)
    if index_heads > 1 and not long:
        for h in range(index_heads):
            if h != own:
                fresh[IQ_BASE + h * HEAD_DIM: IQ_BASE + (h + 1) * HEAD_DIM] = False
    return fresh


# ---------------------------------------------------------------------------------- coverage


def first_own(own: int, init: int, heads: int = INDEX_HEADS_CP) -> int:
    return init + (own - init) % heads


def decode_iscore(written: torch.Tensor, seq_lens: torch.Tensor, q_len: int, own: int, index_heads: int,
                  init: int) -> dict[int, list[tuple[int, int]]]:
    """The (global index head, block) pairs a rank wrote for each token row,
    from its ``written [S, 8192]`` mask of iscore pairs. ``own`` is the rank's
    own index head (its TP rank). Long requests (4-head builds, > 288 blocks)
    use pair ``h * 2048 + b // 4`` for the rank's blocks ``b = first_own + 4 i``
    (so ``b = 4 (pair % 2048) + first_own % 4``); others pair ``b`` of the own head."""
    out: dict[int, list[tuple[int, int]]] = {}
    s = written.shape[0]
    per_head = ISCORE_STRIDE // INDEX_HEADS_CP
    for r in range(s // q_len):
        last = r * q_len + q_len - 1
        long = is_long(request_blocks(seq_lens[last]), index_heads)
        for k in range(r * q_len, last + 1):
            idx = written[k].nonzero().flatten().tolist()
            if long:
                low = first_own(own, init) % INDEX_HEADS_CP
                out[k] = [(p // per_head, INDEX_HEADS_CP * (p % per_head) + low) for p in idx]
            else:
                out[k] = [(own, p) for p in idx]
    return out


def expected_cover(n_blk: int, owns: list[int], long: bool, init: int, local: int) -> set[tuple[int, int]]:
    """What the ranks owning index heads ``owns`` of one TP group must score
    together for a request of ``n_blk`` blocks: long: every head, the blocks
    of the owns' residues (all of [init, n_blk - local) with all four ranks);
    otherwise each own head, every scored block."""
    blocks = list(mref.scored_blocks(n_blk * mref.SPARSE_BLOCK, init, local))
    if long:
        res = {(o - init) % INDEX_HEADS_CP for o in owns}
        return {(h, b) for h in range(INDEX_HEADS_CP) for b in blocks if (b - init) % INDEX_HEADS_CP in res}
    return {(o, b) for o in owns for b in blocks}


def coverage_problems(payloads: list[dict | None], seq_lens: torch.Tensor, q_len: int, init: int, local: int,
                      index_heads: int) -> tuple[list[str], dict]:
    """The cross-rank check: ``payloads[r]`` = ``{"rank", "own", "cover":
    decode_iscore(...)}`` of rank r (None: the rank produced none). Within
    each TP group every expected (head, block) of every row is scored exactly
    once, nothing else. Returns (problems, stats)."""
    problems: list[str] = []
    stats = Counter()
    groups: dict[int, list[dict]] = {}
    for r, p in enumerate(payloads):
        if p is None:
            problems.append(f"rank {r}: no iscore pairs (its run failed)")
            continue
        groups.setdefault(tp_group(p["rank"]), []).append(p)
    s = seq_lens.shape[0]
    for g, members in sorted(groups.items()):
        owns = [m["own"] for m in members]
        if len(set(owns)) != len(owns):
            problems.append(f"group {g}: index heads {owns} not distinct")
            continue
        stats["full_groups" if len(owns) == INDEX_HEADS_CP else "partial_groups"] += 1
        for r in range(s // q_len):
            last = r * q_len + q_len - 1
            n_blk = request_blocks(seq_lens[last])
            long = is_long(n_blk, index_heads)
            want = expected_cover(n_blk, owns, long, init, local)
            if want:
                stats["long_requests" if long else "short_requests"] += 1
            for k in range(r * q_len, last + 1):
                got = Counter()
                for m in members:
                    got.update(m["cover"].get(k, []))
                dup = sorted(x for x, c in got.items() if c > 1)
                missing = sorted(want - set(got))
                extra = sorted(set(got) - want)
                stats["pairs"] += sum(got.values())
                for what, lst in (("scored more than once", dup), ("never scored", missing),
                                  ("scored but not expected", extra)):
                    if lst:
                        problems.append(f"group {g} row {k} ({'long' if long else 'short'}, {n_blk} blocks): "
                                        f"{len(lst)} (head, block) {what}, first {lst[:3]}")
    return problems, dict(stats)


# ---------------------------------------------------------------------------------- comparisons


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))


def first_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    x, y = a.cpu().contiguous().view(torch.uint8).flatten(), b.cpu().contiguous().view(torch.uint8).flatten()
    if x.shape != y.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    bad = (x != y).nonzero().flatten()
    return f"{bad.numel()} bytes differ, first at byte {bad[0].item()}" if bad.numel() else "equal"


def ulp_check(got: torch.Tensor, want: torch.Tensor, max_ulp: int = 2, one_ulp_frac: float = 0.999) -> tuple[bool, str]:
    """qkv within ``max_ulp`` bf16 ulp everywhere and within 1 ulp on at least ``one_ulp_frac``."""
    if got.numel() == 0:
        return True, "no values"
    ulps = mref.bf16_ulp_diff(got, want)
    mx, frac = ulps.max().item(), (ulps <= 1).float().mean().item()
    return mx <= max_ulp and frac >= one_ulp_frac, f"max {mx} ulp, {100 * frac:.3f} % <= 1 ulp"


def view_offset(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Byte offset of ``b``'s data from ``a``'s when both view one allocation, else None."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return None
    return b.data_ptr() - a.data_ptr()


def merge_shared_views(k0: torch.Tensor, v0: torch.Tensor, k1: torch.Tensor, v1: torch.Tensor,
                       offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K / V views of one buffer (the V view ``offset`` bytes after the K view,
    ``offset >= 0``): ``k0, v0`` before, ``k1, v1`` with only their own writes
    (the reference writes separate copies). Returns the views as the shared
    buffer shows them with both sets of writes."""
    kb, vb = k0.contiguous().view(torch.uint8).flatten(), v0.contiguous().view(torch.uint8).flatten()
    nk, nv = kb.numel(), vb.numel()
    buf = torch.empty(max(nk, offset + nv), dtype=torch.uint8)
    buf[offset: offset + nv] = vb
    buf[:nk] = kb
    k1b, v1b = k1.contiguous().view(torch.uint8).flatten(), v1.contiguous().view(torch.uint8).flatten()
    kc, vc = (k1b != kb).nonzero().flatten(), (v1b != vb).nonzero().flatten()
    buf[kc] = k1b[kc]
    buf[offset + vc] = v1b[vc]
    return (buf[:nk].clone().view(k1.dtype).view(k1.shape), buf[offset: offset + nv].clone().view(v1.dtype).view(v1.shape))


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------- MiniMax run


def simulate_minimax(ir, inp: dict, args: dict, ws: dict, index_heads: int, own: int, eps: float, init: int,
                     local: int) -> None:
    """What the kernel writes, from the reference (CPU, no GPU): h_out, the x8 /
    x-scale / qkv / head-done mailboxes with this launch's tag (the other heads'
    index-q rows only in a long step), q_out, iq_out, the caches, the iscore
    pairs; then the epoch advances. Tests the plumbing and the checks."""
    target = inp["target"]
    tokens = inp["ar"].shape[0]
    step = ir.epoch(ws["step"])
    tag = mc.expected_tag(step)
    raw = ws["scratch"]

    def pairs(name):
        r = ir.region(name)
        return raw[r.offset: r.offset + r.nbytes].view(torch.int32).view(-1, 2)

    nq = mref.norm_quant(inp["ar"], inp["res"], inp["g_in"], eps, target)
    args["h_out"].copy_(nq["h_out"])
    x8 = ir.region("x8")
    raw[x8.offset: x8.offset + tokens * HIDDEN].copy_(nq["x8"].view(torch.uint8).flatten())
    x8s = pairs("x8s")
    x8s[:tokens, 0] = nq["x_scale"].view(torch.int32)
    x8s[:tokens, 1] = tag
    qkv = mref.qkv_gemv(nq["x8"], nq["x_scale"], inp["w"], inp["s_qkv"])
    rows = qkv.shape[1]
    long = long_step(args["seq_lens"].cpu(), int(args["q_len"]), index_heads)
    fresh = fresh_rows(rows, index_heads, own, long)
    box = pairs("qkv").view(16, -1, 2)[:tokens, :rows]  # token t, row r at pair t * rows + r
    box[:, fresh, 0] = qkv[:, fresh].view(torch.int32)
    box[:, fresh, 1] = tag
    hdone = pairs("hdone").view(16, -1, 2)[:tokens]
    hdone[..., 0], hdone[..., 1] = 1, tag
    qkv_seen = torch.where(fresh[None, :], qkv, torch.zeros_like(qkv))  # stale rows are never read
    heads = mc.reference_heads(inp, qkv_seen, args, eps=eps, index_own=own)
    shared = view_offset(args["k_cache"], args["v_cache"])
    if shared is not None:  # one allocation: copying one view back must not undo the other's writes
        heads["k_cache"], heads["v_cache"] = merge_shared_views(args["k_cache"], args["v_cache"], heads["k_cache"],
                                                                heads["v_cache"], shared)
    for name in ("q_out", "iq_out", "k_cache", "v_cache", "k_scale", "v_scale", "index_cache"):
        args[name].copy_(heads[name])
    iq = (mref.index_q_heads(qkv_seen, inp["g_iq"], inp["cos_sin"], inp["positions"], eps, index_heads)
          if index_heads > 1 else args["iq_out"].view(tokens, HEAD_DIM))
    scores, written, _ = mref.index_scores(iq, args["index_cache"], args["block_table"], args["seq_lens"],
                                           int(args["q_len"]), init, local, index_heads=index_heads, index_own=own)
    sc = args["iscore"].view(torch.int32).view(16, ISCORE_STRIDE, 2)[:tokens]
    sc[..., 0][written] = scores[written].view(torch.int32)
    sc[..., 1][written] = tag
    ir.advance(ws["step"])


def launch(kernel, args: dict) -> None:
    """Launch and wait; a kernel stuck in a mailbox wait ends the process (the
    other ranks then fail in their next collective) instead of hanging."""
    launch_and_wait(kernel, args, HANG_S)
    torch.cuda.synchronize()


def check_minimax(inp: dict, ctx: dict, args: dict, got: dict, ar: torch.Tensor, ar_ref: torch.Tensor,
                  index_heads: int, own: int, head: int, eps: float, init: int, local: int, step: int, rank: int,
                  ) -> tuple[list[Result], dict]:
    """Every per-rank MiniMax check on the launch's outputs (``args`` after the
    launch, ``got`` = the mailbox read back, plus ``got["caches_before"]``).
    ``own``: the build's index_own; ``head``: the rank's global index head
    (= own in 4-head builds). Returns (results, the rank's iscore cover for the
    cross-rank check: ``{"rank", "own": head, "cover"}``)."""
    res: list[Result] = []
    rk, part = str(rank), "minimax"
    add = lambda name, ok, detail="": res.append(Result(rk, part, name, outcome(ok), detail))  # noqa: E731
    tokens, q_len = inp["ar"].shape[0], int(args["q_len"])
    target = inp["target"]
    tag = mc.expected_tag(step)
    seq, table_ = ctx["seq_lens"], ctx["block_table"]

    add("ar = bf16(rank-ordered f32 sum)", torch.equal(ar.cpu().view(torch.int16), ar_ref.view(torch.int16)),
        first_diff(ar, ar_ref))
    want = mref.norm_quant(ar_ref, inp["res"], inp["g_in"], eps, target)
    add("h_out exact", same_bytes(args["h_out"], want["h_out"]), first_diff(args["h_out"], want["h_out"]))
    ok = torch.equal(got["x_scale"], want["x_scale"]) and same_bytes(got["x8"], want["x8"])
    add("x8, x_scale exact", ok, first_diff(got["x8"], want["x8"]))

    rows = got["qkv"].shape[1]
    long = long_step(seq, q_len, index_heads)
    fresh = fresh_rows(rows, index_heads, own, long)
    tags_ok = bool((got["x8s_tag"] == tag).all() and (got["qkv_tag"][:, fresh] == tag).all()
                   and (got["qkv_tag"][:, ~fresh] != tag).all())
    add("mailbox tags", tags_ok, f"tag {tag}, {int(fresh.sum())} of {rows} rows fresh (long step: {long})")

    qkv_k = mref.qkv_gemv(got["x8"], got["x_scale"], inp["w"], inp["s_qkv"])
    ok, detail = ulp_check(got["qkv"][:, fresh], qkv_k[:, fresh])
    qkv_full = mref.qkv_gemv(want["x8"], want["x_scale"], inp["w"], inp["s_qkv"])
    _, detail_full = ulp_check(got["qkv"][:, fresh], qkv_full[:, fresh])
    ok = ok and torch.equal(got["qkv"], bf16_rn(got["qkv"]))
    add("qkv <= 2 bf16 ulp", ok, f"{detail}; vs x8 of the 1-process ref: {detail_full}")

    qkv_seen = torch.where(fresh[None, :], got["qkv"], torch.zeros_like(got["qkv"]))
    heads = mc.reference_heads(inp, qkv_seen, got["caches_before"], eps=eps, index_own=own)
    if got.get("kv_shared_offset") is not None:  # K and V views of one allocation: each sees the other's writes
        heads["k_cache"], heads["v_cache"] = merge_shared_views(
            got["caches_before"]["k_cache"], got["caches_before"]["v_cache"], heads["k_cache"], heads["v_cache"],
            got["kv_shared_offset"])
    bad = [n for n in ("q_out", "iq_out", "k_cache", "v_cache", "k_scale", "v_scale", "index_cache")
           if not same_bytes(args[n], heads[n])]
    add("q, iq, caches exact given qkv", not bad, ("differ: " + ", ".join(bad)) if bad else "")

    iq = (mref.index_q_heads(qkv_seen, inp["g_iq"], inp["cos_sin"], inp["positions"], eps, index_heads)
          if index_heads > 1 else args["iq_out"].cpu().view(tokens, HEAD_DIM))
    scores, want_w, bound = mref.index_scores(iq, args["index_cache"].cpu(), table_, seq, q_len, init, local,
                                              index_heads=index_heads, index_own=own)
    raw = args["iscore"].cpu()
    pairs = raw.view(torch.int32).view(16, ISCORE_STRIDE, 2)[:tokens]
    written = pairs[..., 1] == tag
    vals = pairs[..., 0].view(torch.float32)
    finite = torch.isfinite(scores[want_w])
    ok = torch.equal(written, want_w)
    detail = f"{int(written.sum())} pairs written, {int(want_w.sum())} expected"
    if ok and want_w.any():
        ok = torch.equal(torch.isfinite(vals[want_w]), finite) and bool(
            ((vals[want_w] - scores[want_w]).abs()[finite] <= bound[want_w][finite]).all())
    rest = raw.view(16, ISCORE_STRIDE, 8)
    ok = ok and bool((rest[:tokens][~written] == CANARY).all() and (rest[tokens:] == CANARY).all())
    add("iscore pairs (own view)", ok, detail)
    cover = decode_iscore(written, seq, q_len, head, index_heads, init)
    return res, {"rank": rank, "own": head, "cover": cover}


def run_minimax(opt, rank: int, world: int, device: torch.device, on_gpu: bool) -> tuple[list[Result], dict | None, dict]:
    """All-reduce, launch (or simulate), per-rank checks. Returns (results, the
    iscore payload or None, the context case)."""
    seed, tokens, q_len = opt.seed, opt.tokens, opt.q_len
    trank, index_heads = tp_rank(rank), index_heads_for(world, opt.cp)
    own = trank if index_heads > 1 else 0
    head = trank  # the rank's global index head (own in 4-head builds)
    # collective: every rank takes part, whatever happens after
    partial = prev_partial(seed, rank, tokens)
    ar = all_reduce_ar(partial, device)
    ctx = minimax_contexts(seed, tokens, q_len, opt.contexts)
    res: list[Result] = []
    try:
        flags = dict(index_heads=index_heads, index_own=own)
        if opt.init_blocks:
            flags["init_blocks"] = opt.init_blocks
        if opt.local_blocks != 1:
            flags["local_blocks"] = opt.local_blocks
        kernel = codegen.load("minimax_m3/pre_attn", tokens=tokens, target=None if on_gpu else opt.target, **flags)
        target = kernel.target.name
        ar_ref = rank_ordered_ar([prev_partial(seed, r, tokens) for r in range(world)])
        inp = minimax_inputs(seed, trank, tokens, target, index_heads, ar)
        ws = kernel.workspace(device)
        args = mc.launch_args(inp, ws, device=str(device))
        args.update(seq_lens=ctx["seq_lens"].to(device), block_table=ctx["block_table"].to(device),
                    bt_width=ctx["bt_cols"], q_len=q_len,
                    index_cache=ctx["index_cache_bytes"].to(device).view(inp["fp8"]),
                    iscore=torch.full((16 * ISCORE_STRIDE * 8,), CANARY, dtype=torch.uint8, device=device))
        args["ar"] = ar.to(device)
        before = {k: args[k].cpu().clone() for k in ("k_cache", "v_cache", "k_scale", "v_scale", "index_cache")}
        step = kernel.ir.epoch(ws["step"])
        if on_gpu:
            launch(kernel, args)
        else:
            simulate_minimax(kernel.ir, inp, args, ws, index_heads, own, opt.eps, opt.init_blocks,
                             opt.local_blocks)
        if opt.fault == "iscore" and rank == 0:
            _inject_iscore_fault(args, step)
        got = mc.read_mailbox(kernel, ws["scratch"], tokens)
        got["caches_before"] = before
        got["kv_shared_offset"] = view_offset(args["k_cache"], args["v_cache"])
        checks, payload = check_minimax(inp, ctx, args, got, ar, ar_ref, index_heads, own, head, opt.eps,
                                        opt.init_blocks, opt.local_blocks, step, rank)
        res += checks
        long = long_step(ctx["seq_lens"], q_len, index_heads)
        res.append(Result(str(rank), "minimax", "build", "info",
                          f"{target} S={tokens} q_len={q_len} index_heads={index_heads} own={own} "
                          f"long step={long} ({'kernel' if on_gpu else 'reference simulation'})"))
        return res, payload, ctx
    except Exception as e:  # noqa: BLE001
        res.append(Result(str(rank), "minimax", "run", "fail", f"{type(e).__name__}: {e}"))
        traceback.print_exc()
        return res, None, ctx


def _inject_iscore_fault(args: dict, step: int) -> None:
    """Test hook (``--fault iscore``): the first iscore pair this launch wrote
    loses its tag, as if the kernel had skipped that block."""
    sc = args["iscore"].view(torch.int32).view(16, ISCORE_STRIDE, 2)
    hit = (sc[..., 1] == mc.expected_tag(step)).nonzero()
    if hit.numel():
        k, p = hit[0].tolist()
        sc[k, p, 1] = 0


# ---------------------------------------------------------------------------------- DeepSeek


def ds_head_rows(seed: int, head: int, target) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's 512 rows of the layer's wq_b (logical fp8, [512, 1280]) and
    its E8M0 codes per 32 x 32 block ([16, 40]), from the head's seed."""
    from codegen.fp import fp8_dtype
    from codegen.reference import deepseek_v41 as dref

    t = get_target(target) if isinstance(target, str) else target
    g = torch.Generator().manual_seed(seed_for(seed, "wqb", head))
    w = (torch.randn(dref.HEAD_DIM, dref.Q_RANK, generator=g) * 1.5).clamp(-t.fp8_max, t.fp8_max).to(fp8_dtype(t))
    codes = torch.randint(116, 122, (dref.HEAD_DIM // 32, dref.Q_RANK // 32), generator=g, dtype=torch.int32)
    return w, codes.to(torch.uint8)


def ds_wqb(seed: int, heads: range, target) -> tuple[torch.Tensor, torch.Tensor]:
    """wq_b rows and codes of ``heads`` (a rank's shard, or all 64)."""
    parts = [ds_head_rows(seed, h, target) for h in heads]
    return torch.cat([w for w, _ in parts]), torch.cat([c for _, c in parts])


def ds_shard(full_w: torch.Tensor, full_codes: torch.Tensor, heads: range) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's wq_b rows (and code rows) out of the layer's: 512 rows (16 code rows) per head."""
    rows, crows = slice(heads.start * 512, heads.stop * 512), slice(heads.start * 16, heads.stop * 16)
    return full_w[rows].clone(), full_codes[crows].clone()


def ds_shard_heads(rank: int, tp: int) -> range:
    from codegen.reference import deepseek_v41 as dref

    n = dref.local_heads(tp)
    return range(rank * n, (rank + 1) * n)


def deepseek_available() -> tuple[bool, str]:
    """Whether the DeepSeek reference (``attn_front``) and its test case
    helpers exist; whether the reference runs shows in ``run_deepseek``."""
    try:
        from codegen.reference import deepseek_v41 as dref
        from tests import deepseek_case as dc
    except Exception as e:  # noqa: BLE001
        return False, f"DeepSeek reference or test case not importable ({type(e).__name__}: {e})"
    missing = [f"codegen.reference.deepseek_v41.{n}" for n in ("attn_front", "local_heads")
               if not callable(getattr(dref, n, None))]
    missing += [f"tests.deepseek_case.{n}" for n in ("make_case", "launch_args", "simulate", "check", "read_scratch")
                if not callable(getattr(dc, n, None))]
    if missing:
        return False, "missing: " + ", ".join(missing)
    return True, ""


def run_deepseek(opt, rank: int, world: int, device: torch.device, on_gpu: bool) -> tuple[list[Result], dict | None]:
    """Per-rank DeepSeek front at tp = world. Returns (results, digest of the
    replicated outputs or None)."""
    res: list[Result] = []
    rk, part = str(rank), "deepseek"
    try:
        from codegen.reference import deepseek_v41 as dref
        from tests import deepseek_case as dc

        tp, s = world, opt.ds_tokens
        kernel = codegen.load("deepseek_v41/attn_front", tokens=s, tp=tp, ratio=opt.ds_ratio,
                              target=None if on_gpu else opt.target)
        target = kernel.target.name
        case = dc.make_case(s, tp, opt.ds_ratio, target, seed=seed_for(opt.seed, "deepseek"),
                            pad_rows=(1,) if s > 1 else ())
        heads = ds_shard_heads(rank, tp)
        full_w, full_s = ds_wqb(opt.seed, range(dref.N_HEADS), target)
        wqb, wqb_s = ds_shard(full_w, full_s, heads)
        case.logical["wqb"], case.logical["wqb_s"] = wqb, wqb_s
        inp, lg = case.inputs, case.logical
        # the single-process reference of the whole layer (64 heads); a broken reference: a skip
        try:
            full = dref.attn_front(inp["x"], lg["wqkv"], lg["wqkv_s"], inp["qn_w"], inp["kvn_w"], full_w, full_s,
                                   inp["cos_sin"], inp["pos"], inp["slot"], target, dref.N_HEADS)
        except Exception as e:  # noqa: BLE001
            res.append(Result(rk, part, "reference", "skip",
                              f"deepseek_v41.attn_front raised {type(e).__name__}: {e}"))
            return res, None
        # the shard's wq_b on the layer's normed q latent gives the layer's q heads of this rank, exactly
        sl = slice(heads.start, heads.stop)
        mine = bf16_rn(dref.mx_gemv(full["qx8"], full["q_codes"], wqb, wqb_s)[0].float())
        mine = dref.q_rope(mine.reshape(s, len(heads), dref.HEAD_DIM), inp["pos"], inp["cos_sin"])
        res.append(Result(rk, part, "shard ref = 64-head ref slice", outcome(torch.equal(mine, full["q"][:, sl])),
                          f"heads {heads.start}..{heads.stop - 1}"))

        ws = kernel.workspace(device)
        args = dc.launch_args(case, ws, device=str(device))
        if on_gpu:
            launch(kernel, args)
        else:
            dc.simulate(case, kernel.ir, args)
        try:
            stats = dc.check(case, kernel.ir, args, epoch=0)
            res.append(Result(rk, part, "kernel vs reference (own intermediates)", "pass",
                              f"q max {stats['q_ulp_max']} ulp, {100 * stats['q_exact_frac']:.3f} % exact"))
        except AssertionError as e:
            res.append(Result(rk, part, "kernel vs reference (own intermediates)", "fail", str(e)[:300]))
        q = args["q"].cpu().float()
        want = full["q"][:, sl].float()
        ulps = mref.bf16_ulp_diff(q, want)
        res.append(Result(rk, part, "q vs 64-head reference", "info",
                          f"max {ulps.max().item()} ulp, {100 * (ulps == 0).float().mean().item():.3f} % exact "
                          f"({target} tp={tp} S={s} ratio={opt.ds_ratio}, "
                          f"{'kernel' if on_gpu else 'reference simulation'})"))
        got = dc.read_scratch(kernel.ir, args["scratch"], s)
        dg = digest(got["partials"], got["qx8"], got["qx8s"], args["swa"], args["kt"], args["klen"])
        return res, {"rank": rank, "digest": dg}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        res.append(Result(rk, part, "run", "fail", f"{type(e).__name__}: {e}"))
        return res, None


# ---------------------------------------------------------------------------------- main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> tuple[int, int, int, torch.device, bool]:
    """torch.distributed from torchrun's environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, LOCAL_RANK), or world size 1 when started plainly.
    nccl with CUDA (one GPU per local rank), else gloo."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        if local >= torch.cuda.device_count():
            raise SystemExit(f"rank {rank}: LOCAL_RANK {local} but {torch.cuda.device_count()} GPU(s) visible")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    kw = dict(rank=rank, world_size=world, timeout=datetime.timedelta(minutes=10))
    try:
        dist.init_process_group("nccl" if on_gpu else "gloo", **kw, **({"device_id": device} if on_gpu else {}))
    except TypeError:  # torch < 2.3: no device_id (the communicator binds on first use)
        dist.init_process_group("nccl" if on_gpu else "gloo", **kw)
    return rank, world, local, device, on_gpu


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1234, help="the run's seed (everything derives from it)")
    p.add_argument("--tokens", type=int, default=4, help="MiniMax decode rows S (1..16)")
    p.add_argument("--q-len", type=int, default=1, help="MiniMax rows per request")
    p.add_argument("--contexts", type=lambda v: [int(x) for x in v.split(",")], default=list(DEFAULT_CONTEXTS),
                   help="context of each request's last row, comma-separated (cycled); > 36864 = long")
    p.add_argument("--cp", action="store_true", help="4 index heads even at world size 1 (own = 0)")
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--init-blocks", type=int, default=0)
    p.add_argument("--local-blocks", type=int, default=1)
    p.add_argument("--ds-tokens", type=int, default=6, help="DeepSeek decode rows")
    p.add_argument("--ds-ratio", type=int, default=1, choices=(0, 1, 2))
    p.add_argument("--parts", default="minimax,deepseek", help="which kernels: minimax,deepseek")
    p.add_argument("--target", default="sm90", help="reference target without a GPU (fp8 flavour)")
    p.add_argument("--fault", default="none", choices=("none", "iscore"), help=argparse.SUPPRESS)
    opt = p.parse_args(argv)
    if opt.tokens % opt.q_len:
        p.error("--tokens must be a multiple of --q-len")
    return opt


def main(argv=None) -> int:
    opt = parse(argv)
    parts = {x.strip() for x in opt.parts.split(",") if x.strip()}
    rank, world, _, device, on_gpu = init_distributed()
    results: list[Result] = []
    shared: list[Result] = []  # cross-rank checks, the same on every rank

    if "minimax" in parts:
        mm, payload, ctx = run_minimax(opt, rank, world, device, on_gpu)
        results += mm
        payloads: list = [None] * world
        dist.all_gather_object(payloads, payload)
        index_heads = index_heads_for(world, opt.cp)
        problems, st = coverage_problems(payloads, ctx["seq_lens"], opt.q_len, opt.init_blocks, opt.local_blocks,
                                         index_heads)
        full, partial = st.get("full_groups", 0), st.get("partial_groups", 0)
        detail = (f"{st.get('long_requests', 0)} long + {st.get('short_requests', 0)} short scored request(s) "
                  f"over {full + partial} TP group(s), {st.get('pairs', 0)} pairs"
                  + (f"; {partial} partial group(s) (< 4 ranks): their ranks' share only" if partial else ""))
        shared.append(Result("all", "minimax", "iscore blocks once per head", outcome(not problems),
                             "; ".join(problems[:3]) if problems else detail))

    if "deepseek" in parts:
        ok, why = deepseek_available()
        if not ok:
            shared.append(Result("all", "deepseek", "front", "skip", why))
        elif world not in (2, 4):
            shared.append(Result("all", "deepseek", "front", "skip", f"DeepSeek TP is 2 or 4, world size is {world}"))
        else:
            ds, dg = run_deepseek(opt, rank, world, device, on_gpu)
            results += ds
            digests: list = [None] * world
            dist.all_gather_object(digests, dg)
            skipped = all(d is None for d in digests) and all(r.status == "skip" for r in ds)
            if not skipped:  # (a broken reference is a skip on every rank: nothing to compare)
                vals = {d["digest"] if d else None for d in digests}
                okd = None not in vals and len(vals) == 1
                shared.append(Result("all", "deepseek", "replicated outputs equal across ranks", outcome(okd),
                                     f"digests {sorted(str(v) for v in vals)}" if not okd else
                                     "wqkv partials, QX8, key table, SWA records"))

    gathered: list = [None] * world
    dist.all_gather_object(gathered, [r.__dict__ for r in results])
    everything = [Result(**d) for per in gathered for d in per] + shared
    passed, failed, skipped = counts(everything)
    if rank == 0:
        print(f"tp_run: world size {world}, backend {dist.get_backend()}, "
              f"{'GPU kernels' if on_gpu else 'CPU reference path (no GPU)'}")
        print(table(everything))
        for r in everything:
            if r.status == "skip":
                print(f"tp_run: skipped: {r.part} {r.check}: {r.detail}")
        print(f"tp_run: {passed} passed, {failed} failed", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
