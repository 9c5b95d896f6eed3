"""The unfused MiniMax-M3 pre_attn chain (the benchmark's peer) against the
exact reference, on the CPU.

What is compared, and why these tolerances:
* h_out: exact (one f32 add, one RNE conversion in both).
* x_scale: within 2^-20 relative. The chain's ``mean`` and ``rsqrt`` are
  torch's (another summation order, not correctly rounded), so normed values
  and their amax differ in the last f32 bits.
* x8: a value may sit on the neighbouring FP8 code (when its quotient lies
  within those bits of a rounding midpoint): only adjacent codes, and rarely.
* qkv: every element within ``compare_qkv``'s bound: 2 bf16 ulps + 2^-16 of
  sum_k |x8 * w| * scales (f32 accumulation order; values whose dot product
  cancels to near zero can be many ulps off and still as accurate as the
  inputs allow) + the exact effect of the FP8 flips. And >= 99 % of values
  within 2 ulps: a flip moves every output of its token, so a single flip can
  push some tenths of a percent of a token's values past 2 ulps."""

from __future__ import annotations

import pytest
import torch

from codegen.reference import minimax_m3 as ref
from codegen.reference.minimax_m3_unfused import (
    bf16_ulp,
    compare_qkv,
    compare_quant,
    fp8_gemm_rowwise,
    norm_quant_unfused,
    pick_gemm,
    pre_attn_unfused,
)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
EPS = 1e-6
REL_ACC_CPU = 2.0**-16  # f32 accumulation on the CPU (seen: < 2^-25)


def make_inputs(tokens: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "ar": (torch.randn(tokens, ref.HIDDEN, generator=g) * 0.7).bfloat16(),
        "res": (torch.randn(tokens, ref.HIDDEN, generator=g) * 1.3).bfloat16(),
        "g_in": (torch.randn(ref.HIDDEN, generator=g) * 0.1).bfloat16(),
        "w": (torch.randn(ref.QKV_ROWS, ref.HIDDEN, generator=g) * 0.3).clamp(-FP8_MAX, FP8_MAX).to(FP8),
        "s": torch.rand(ref.QKV_ROWS, generator=g) * 0.02 + 0.005,
    }


_cache: dict = {}


def case(tokens: int, seed: int):
    """Inputs and the exact reference (computed once per case)."""
    key = (tokens, seed)
    if key not in _cache:
        inp = make_inputs(tokens, seed)
        want = ref.pre_attn_front(inp["ar"], inp["res"], inp["g_in"], inp["w"], inp["s"], EPS, "sm90")
        _cache[key] = (inp, want)
    return _cache[key]


@pytest.mark.parametrize("gemm", ["dequant", "scaled_mm"])
@pytest.mark.parametrize("tokens,seed", [(1, 101), (4, 201), (16, 1600)])
def test_unfused_matches_reference(tokens, seed, gemm):
    inp, want = case(tokens, seed)
    h_out, qkv, x8, x_scale = pre_attn_unfused(
        inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX,
        gemm=gemm, return_quant=True)
    assert h_out.dtype == torch.bfloat16 and qkv.dtype == torch.bfloat16
    assert qkv.shape == (tokens, ref.QKV_ROWS) and x_scale.shape == (tokens, 1)
    assert torch.equal(h_out.view(torch.int16), want["h_out"].view(torch.int16))

    q = compare_quant(x8, x_scale, want["x8"], want["x_scale"])
    assert q["x_scale_max_rel"] <= 2.0**-20, q
    assert q["x8_max_code_distance"] <= 1, q
    assert q["x8_flips"] <= max(2, q["x8_values"] // 10_000), q

    c = compare_qkv(qkv, x8, x_scale, want["qkv"], want["x8"], want["x_scale"], inp["w"], inp["s"],
                    rel_acc=REL_ACC_CPU)
    assert c["ok"], c
    assert c["frac_le2"] >= 0.99, c


def test_seed_with_fp8_flip_is_covered():
    """S = 16, seed 1600: the chain's x8 differs from the contract's in one
    value (found by search). The flip term of the bound must carry it: without
    it the comparison fails, with it it passes."""
    inp, want = case(16, 1600)
    _, qkv, x8, xs = pre_attn_unfused(inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8,
                                      FP8_MAX, gemm="dequant", return_quant=True)
    q = compare_quant(x8, xs, want["x8"], want["x_scale"])
    assert q["x8_flips"] >= 1, "seed no longer produces a flip: pick another"
    no_flip = compare_qkv(qkv, want["x8"], xs, want["qkv"], want["x8"], want["x_scale"], inp["w"], inp["s"],
                          rel_acc=REL_ACC_CPU)
    assert not no_flip["ok"]


def test_gemm_given_same_quant_is_tight():
    """Given the contract's own x8 and scales, both GEMMs are within 2 ulps of
    the exactly rounded one except where the dot product cancels (bound)."""
    inp, want = case(4, 201)
    for gemm in ("dequant", "scaled_mm"):
        qkv = fp8_gemm_rowwise(want["x8"], want["x_scale"], inp["w"].t(), inp["s"], gemm)
        c = compare_qkv(qkv, want["x8"], want["x_scale"], want["qkv"], want["x8"], want["x_scale"],
                        inp["w"], inp["s"], rel_acc=REL_ACC_CPU)
        assert c["ok"] and c["frac_le1"] >= 0.999, (gemm, c)


def test_padding_rows_changes_nothing():
    inp, want = case(4, 201)
    a = fp8_gemm_rowwise(want["x8"], want["x_scale"], inp["w"].t(), inp["s"], "scaled_mm", pad_m=1)
    b = fp8_gemm_rowwise(want["x8"], want["x_scale"], inp["w"].t(), inp["s"], "scaled_mm", pad_m=16)
    assert b.shape == a.shape and torch.equal(a, b)


def test_zero_row_has_unit_scale():
    """acc == 0 (ar = -res): x_scale 1.0 (contract A.5.2), x8 and qkv zero."""
    inp = make_inputs(2, 5)
    res = inp["res"].clone()
    res[1] = -inp["ar"][1]
    h, qkv, x8, xs = pre_attn_unfused(inp["ar"], res, inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX,
                                      gemm="dequant", return_quant=True)
    assert xs[1, 0].item() == 1.0 and not x8[1].float().any() and not qkv[1].float().any()
    assert not h[1].float().any()


def test_pick_gemm_on_cpu():
    assert pick_gemm("cpu") == "dequant"


def test_bf16_ulp():
    x = torch.tensor([1.0, 1.5, 2.0, -3.0, 0.0])
    assert bf16_ulp(x).tolist() == [2.0**-7, 2.0**-7, 2.0**-6, 2.0**-6, 2.0**-133]
    nxt = (x[:4].bfloat16().view(torch.int16) + 1).view(torch.bfloat16).float()
    assert torch.equal((nxt - x[:4].bfloat16().float()).abs(), bf16_ulp(x[:4]))


def test_compiles_without_graph_breaks():
    """torch.compile traces the whole chain as one graph (the bench compiles
    it with inductor on the GPU; the eager backend checks the tracing here)."""
    torch._dynamo.reset()
    inp, _ = case(1, 101)
    fn = torch.compile(pre_attn_unfused, backend="eager", fullgraph=True, dynamic=False)
    h, qkv = fn(inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX, gemm="dequant")
    h2, qkv2 = pre_attn_unfused(inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX,
                                gemm="dequant")
    assert torch.equal(h, h2) and torch.equal(qkv, qkv2)


def test_norm_quant_unfused_shapes():
    inp = make_inputs(3, 9)
    h, x8, xs = norm_quant_unfused(inp["ar"], inp["res"], inp["g_in"], EPS, FP8, FP8_MAX)
    assert h.shape == (3, ref.HIDDEN) and x8.dtype == FP8 and xs.shape == (3, 1) and xs.dtype == torch.float32


# ------------------------------------------------------------------ steps 3-4: head tasks and scores
#
# heads_unfused: exact against the contract's heads() given the same qkv (every
# q / iq value, cache byte and scale; pad rows write nothing). index_scores_unfused:
# exactly the reference's pairs written (the others untouched), values within
# 2^-16 x sum|K||q| x scale of the float64 reference. k1_unfused under
# torch.compile (eager backend: the traced-only paths, f64 divisions and
# integer bf16 rounding) gives the same bytes as eagerly.

from codegen.reference.minimax_m3_unfused import (  # noqa: E402
    compare_head_outputs,
    compare_heads,
    compare_iscore,
    heads_unfused,
    index_scores_unfused,
    k1_unfused,
    packed_kv,
    score_delta_bound,
)
from tests import minimax_case as mc  # noqa: E402

V_OFFSET = 8 * ref.PAGE_BYTES  # packed sides: the V view starts 8 pages into the K view


def _caches(inp):
    c = mc.caches(inp, "cpu")
    return c, {k: v.clone() for k, v in c.items()}


def _run_heads(qkv, inp, c, **kw):
    return heads_unfused(qkv, inp["g_q"], inp["g_k"], inp["g_iq"], inp["g_ik"], inp["cos_sin"], inp["positions"],
                         inp["slot_mapping"], c["k_cache"].view(torch.uint8), c["v_cache"].view(torch.uint8),
                         c["k_scale"], c["v_scale"], c["index_cache"].view(torch.uint8), EPS, inp["fp8"], FP8_MAX, **kw)


def _ref_heads(qkv, inp, c0, static=False, own=0):
    want = ref.heads(qkv.float(), inp["g_q"], inp["g_k"], inp["g_iq"], inp["g_ik"], inp["cos_sin"], inp["positions"],
                     inp["slot_mapping"], c0["k_cache"], c0["v_cache"], c0["k_scale"], c0["v_scale"],
                     c0["index_cache"], EPS, "sm90", static, inp["kv_page_stride"], inp["index_heads"], own)
    return packed_kv(want, c0["v_cache"], V_OFFSET if inp["kv_page_stride"] == 16 else None)


HEAD_CASES = [  # tokens, seed, kv_page_stride, static_kv_scale, index_heads, index_own
    (1, 11, 16, False, 1, 0),
    (16, 12, 16, False, 1, 0),
    (7, 13, 8, True, 1, 0),
    (5, 14, 16, False, 4, 2),
]


@pytest.mark.parametrize("tokens,seed,stride,static,heads,own", HEAD_CASES)
def test_heads_unfused_exact(tokens, seed, stride, static, heads, own):
    """Random bf16 qkv (a zero head, pad rows): every output byte equals the
    contract's heads() from the same caches."""
    inp = mc.make_inputs(tokens, "sm90", seed, kv_page_stride=stride, index_heads=heads)
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(tokens, inp["w"].shape[0], generator=g) * 3).bfloat16()
    qkv[0, ref.K_OFF:ref.K_OFF + 128] = 0  # amax 0: unit K scale
    c, c0 = _caches(inp)
    q, iq = _run_heads(qkv, inp, c, static_kv_scale=static, kv_page_stride=stride, index_heads=heads, index_own=own)
    want = _ref_heads(qkv, inp, c0, static, own)
    r = compare_heads({"q_out": q, "iq_out": iq, **c}, want)
    assert r["ok"] and r["exact"], r
    live = int((inp["slot_mapping"] >= 0).sum())
    assert int((c["k_scale"] != -7.0).sum()) == live  # one scale per live slot, none for pad rows
    if stride == 16:  # packed sides through the K view alone (v_cache None): the same bytes
        c2, _ = _caches(inp)
        heads_unfused(qkv, inp["g_q"], inp["g_k"], inp["g_iq"], inp["g_ik"], inp["cos_sin"], inp["positions"],
                      inp["slot_mapping"], c2["k_cache"].view(torch.uint8), None, c2["k_scale"], c2["v_scale"],
                      c2["index_cache"].view(torch.uint8), EPS, inp["fp8"], FP8_MAX, static_kv_scale=static,
                      index_heads=heads, index_own=own, v_offset=V_OFFSET)
        for k in c:
            assert torch.equal(c2[k].view(torch.uint8), c[k].view(torch.uint8)), k


def test_heads_unfused_no_live_row():
    """Every slot < 0: q / iq computed, no cache byte or scale written."""
    inp = mc.make_inputs(3, "sm90", 21)
    inp["slot_mapping"] = torch.full((3,), -1, dtype=torch.int64)
    qkv = (torch.randn(3, ref.QKV_ROWS, generator=torch.Generator().manual_seed(3)) * 2).bfloat16()
    c, c0 = _caches(inp)
    q, iq = _run_heads(qkv, inp, c)
    for k in c:
        assert torch.equal(c[k].view(torch.uint8), c0[k].view(torch.uint8)), k
    want = _ref_heads(qkv, inp, c0)
    assert torch.equal(q.view(torch.int16), want["q_out"].view(torch.int16))
    assert torch.equal(iq.view(torch.int16), want["iq_out"].view(torch.int16))


def test_compare_heads_catches_one_byte():
    inp = mc.make_inputs(2, "sm90", 31, negative_slots=False)
    qkv = (torch.randn(2, ref.QKV_ROWS, generator=torch.Generator().manual_seed(4))).bfloat16()
    c, c0 = _caches(inp)
    q, iq = _run_heads(qkv, inp, c)
    want = _ref_heads(qkv, inp, c0)
    slot = int(inp["slot_mapping"][1])
    c["index_cache"].view(torch.uint8).view(-1)[slot * 128 + 5] += 1
    r = compare_heads({"q_out": q, "iq_out": iq, **c}, want)
    assert not r["ok"] and r["index_cache"]["differ"] == 1
    assert compare_heads({"q_out": q, "iq_out": iq, **c}, want, exact=False)["ok"]  # one code: the allowance


SCORE_CASES = [  # tokens, q_len, contexts[, init_blocks, local_blocks]
    (1, 1, [20000]),
    (1, 1, [2048]),  # 16 blocks: nothing scored
    (4, 1, [1, 2049, 5000, 130]),
    (4, 2, [2065, 9000]),  # rows masked by their own seq
    (4, 2, [5000, 7000], 1, 2),
    (2, 2, [2177], 0, 0),  # no local block: row 0 sees none of block 17's keys (-inf)
]


@pytest.mark.parametrize("case_args", SCORE_CASES, ids=str)
def test_index_scores_unfused(case_args):
    tokens, q_len, contexts, *pinned = case_args
    init, local = pinned or (0, 1)
    cc = mc.context_case(tokens, q_len, contexts, seed=tokens + q_len, num_blocks=256)
    iq = torch.randn(tokens, 1, 128, generator=torch.Generator().manual_seed(5)).bfloat16()
    iscore = torch.full((16 * 8192 * 8,), 0x5A, dtype=torch.uint8)
    before = iscore.clone()
    tag = torch.tensor([9], dtype=torch.int32)
    index_scores_unfused(iq, cc["index_cache_bytes"], cc["block_table"], cc["seq_lens"],
                         iscore.view(torch.int64).view(16, 8192), tag, FP8, q_len=q_len, init_blocks=init,
                         local_blocks=local)
    scores, want, bound = ref.index_scores(iq.float().view(tokens, 128), cc["index_cache_bytes"].view(FP8),
                                           cc["block_table"], cc["seq_lens"], q_len, init, local)
    r = compare_iscore(iscore, before, 9, scores, want, bound)
    assert r["ok"], r
    assert (r["written"] > 0) == (max(contexts) > 2048)
    if local == 0:
        assert bool(torch.isinf(scores[want]).any())


def test_compare_iscore_catches_errors():
    cc = mc.context_case(2, 1, [3000, 2500], seed=7, num_blocks=64)
    iq = torch.randn(2, 128, generator=torch.Generator().manual_seed(6)).bfloat16()
    scores, want, bound = ref.index_scores(iq.float(), cc["index_cache_bytes"].view(FP8), cc["block_table"],
                                           cc["seq_lens"], 1)
    good = torch.zeros(16 * 8192 * 8, dtype=torch.uint8)
    index_scores_unfused(iq, cc["index_cache_bytes"], cc["block_table"], cc["seq_lens"],
                         good.view(torch.int64).view(16, 8192), torch.tensor([3]), FP8)
    zero = torch.zeros_like(good)
    assert compare_iscore(good, zero, 3, scores, want, bound)["ok"]
    pairs = good.clone().view(torch.int32).view(16, 8192, 2)
    b = int(want[1].nonzero()[0])
    pairs[1, b, 0] = (pairs[1, b, 0].view(torch.float32) * 1.01).view(torch.int32)
    assert compare_iscore(pairs, zero, 3, scores, want, bound)["n_over"] == 1
    stray = good.clone().view(torch.int32).view(16, 8192, 2)
    stray[0, 8000, 0] = 1  # an unscored pair's value word
    assert compare_iscore(stray, zero, 3, scores, want, bound)["untouched_changed"] == 1
    late = good.clone().view(torch.int32).view(16, 8192, 2)
    late[0, b, 1] = 2  # a stale tag
    assert compare_iscore(late, zero, 3, scores, want, bound)["mask_differs"] == 1


def test_head_outputs_propagation_bound():
    """The chain's qkv differs from the contract's (S = 16, seed 1600: an FP8
    flip and f32 accumulation order); the head outputs of each, computed
    exactly, stay within compare_head_outputs' bound of each other; 8 ulps
    on a large value do not."""
    inp, want = case(16, 1600)
    _, qkv, _, _ = pre_attn_unfused(inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s"], EPS, FP8, FP8_MAX,
                                    gemm="dequant", return_quant=True)
    assert not torch.equal(qkv.float(), want["qkv"])
    heads_in = mc.make_inputs(16, "sm90", 1600)
    outs = []
    for q in (qkv.float(), want["qkv"]):
        c, c0 = _caches(heads_in)
        outs.append(_ref_heads(q, heads_in, c0))
    g_q, g_iq = heads_in["g_q"], heads_in["g_iq"]
    r = compare_head_outputs(outs[0]["q_out"], outs[0]["iq_out"], qkv, outs[1]["q_out"], outs[1]["iq_out"],
                             want["qkv"], g_q, g_iq, EPS)
    assert r["ok"] and r["max_ulp"] >= 1, r
    bad = outs[0]["q_out"].float().clone()
    i = int(bad[3].abs().argmax())
    bad[3, i] = (bad[3, i] * (1 + 8 * 2.0**-8)).bfloat16().float()
    r = compare_head_outputs(bad, outs[0]["iq_out"], qkv, outs[1]["q_out"], outs[1]["iq_out"], want["qkv"], g_q, g_iq,
                             EPS)
    assert not r["ok"] and r["n_over"] == 1


def test_score_delta_bound_covers_iq_difference():
    cc = mc.context_case(2, 1, [4000, 3000], seed=8, num_blocks=80)
    g = torch.Generator().manual_seed(8)
    iq_a = torch.randn(2, 128, generator=g).bfloat16()
    iq_b = (iq_a.float() * (1 + 2.0**-7 * torch.randn(2, 128, generator=g))).bfloat16()
    ic = cc["index_cache_bytes"].view(FP8)
    sa, wa, ba = ref.index_scores(iq_a.float(), ic, cc["block_table"], cc["seq_lens"], 1)
    sb, wb, bb = ref.index_scores(iq_b.float(), ic, cc["block_table"], cc["seq_lens"], 1)
    d = score_delta_bound(iq_a, iq_b, ic, cc["block_table"], cc["seq_lens"], 1)
    assert torch.equal(wa, wb) and wa.any()
    assert ((sa - sb).abs()[wa] <= d[wa] + ba[wa] + bb[wa]).all()
    assert ((sa - sb).abs()[wa] > 0).any() and (d[wa] > 0).all()


def _k1(fn, inp, cc, c, ic, iscore, tag=5):
    return fn(inp["ar"], inp["res"], inp["g_in"], inp["w"].t(), inp["s_qkv"], inp["g_q"], inp["g_k"], inp["g_iq"],
              inp["g_ik"], inp["cos_sin"], inp["positions"], inp["slot_mapping"], c["k_cache"].view(torch.uint8),
              c["v_cache"].view(torch.uint8), c["k_scale"], c["v_scale"], ic, cc["block_table"], cc["seq_lens"],
              iscore.view(torch.int64).view(16, 8192), torch.tensor([tag], dtype=torch.int32), eps=EPS,
              fp8_dtype=FP8, fp8_max=FP8_MAX, gemm="dequant")


def test_k1_unfused_against_reference_and_compiled():
    """The whole chain (S = 4, pad rows, 3K / 5K contexts): heads exact given
    its own qkv, scores within the bound on its own iq and index cache (this
    launch's keys included), and torch.compile (one graph, eager backend) gives
    the same bytes."""
    torch._dynamo.reset()
    inp = mc.make_inputs(4, "sm90", 41)
    cc = mc.context_case(4, 1, [3000, 5000], seed=9, num_blocks=200)
    results = []
    for fn in (k1_unfused, torch.compile(k1_unfused, backend="eager", fullgraph=True, dynamic=False)):
        c, c0 = _caches(inp)
        ic = cc["index_cache_bytes"].clone()
        iscore = torch.full((16 * 8192 * 8,), 0x5A, dtype=torch.uint8)
        out = _k1(fn, inp, cc, c, ic, iscore)
        results.append((out, c, ic, iscore))
    (out, c, ic, iscore), (out2, c2, ic2, iscore2) = results
    for k in out:
        assert torch.equal(out[k].view(torch.uint8), out2[k].view(torch.uint8)), k
    for k in c:
        assert torch.equal(c[k].view(torch.uint8), c2[k].view(torch.uint8)), k
    assert torch.equal(ic, ic2) and torch.equal(iscore, iscore2)

    c0 = mc.caches(inp, "cpu")
    c0["index_cache"] = cc["index_cache_bytes"].view(FP8)
    want = _ref_heads(out["qkv"], inp, c0)
    r = compare_heads({"q_out": out["q_out"], "iq_out": out["iq_out"], **c, "index_cache": ic.view(FP8)}, want)
    assert r["ok"] and r["exact"], r
    scores, written, bound = ref.index_scores(out["iq_out"].float().view(4, 128), ic.view(FP8), cc["block_table"],
                                              cc["seq_lens"], 1)
    r = compare_iscore(iscore, torch.full_like(iscore, 0x5A), 5, scores, written, bound)
    assert r["ok"] and r["written"] == 2 * (23 + 39), r  # rows of 3000 and 5000 tokens: 24 and 40 blocks


def test_bf16_values_traced_path():
    """The integer bf16 rounding a traced graph uses equals torch's conversion
    (ties to even, subnormals, overflow to inf, signed zeros)."""
    from codegen.reference.minimax_m3_unfused import _bf16_values

    g = torch.Generator().manual_seed(12)
    x = torch.randn(100_000, generator=g) * torch.exp2(torch.randint(-140, 128, (100_000,), generator=g).float())
    ties = (torch.randint(0, 2**15, (1000,), generator=g).to(torch.int32) << 16 | 0x8000).view(torch.float32)
    x = torch.cat([x, ties, torch.tensor([0.0, -0.0, 3.3895e38, -3.3895e38, float("inf")])])
    x = x[~x.isnan()]  # NaN is not expected (the rounding does not keep it quiet)
    traced = torch.compile(_bf16_values, backend="eager", fullgraph=True)(x)
    assert torch.equal(traced.view(torch.int32), x.to(torch.bfloat16).float().view(torch.int32))
