"""The unfused DeepSeek-V4.1 attn_front chain (the benchmark's peer,
codegen/reference/deepseek_v41_unfused.py) against the exact reference
(codegen/reference/deepseek_v41.py), on the CPU.

What is compared, and why these tolerances (``compare_with_reference``):
* exact: the MXFP8 rule (its division-free integer form, over edge cases and
  random amax values, both FP8 flavours), X8 / codes, QX8 / codes given the
  chain's ys, the roped kv given its kn (eager: separate mul / add, as the
  contract), the whole SWA cache (records at live slots, canaries elsewhere,
  pad rows writing nothing), KT / KLEN.
* tolerance: qkv and q within 1 bf16 ulp (+ the RoPE pair terms) + 2^-16 of
  sum |x w| (f32 accumulation order of the bf16 matmul; seen well inside);
  ys / kn at most 1 bf16 ulp from the kernel-order norms of the chain's own
  qkv (torch's mean / rsqrt: another order), >= 98 % identical."""

from __future__ import annotations

import pytest
import torch

from codegen.fp import fp8_dtype
from codegen.reference import deepseek_v41 as ref
from codegen.reference import deepseek_v41_unfused as U

from . import deepseek_case as dc

REL_ACC_CPU = 2.0**-16


def run_chain(case, fn=U.attn_front_unfused, swa=None):
    inp, lg = case.inputs, case.logical
    swa = inp["swa"].clone() if swa is None else swa
    out = fn(inp["x"], lg["wqkv"], lg["wqkv_s"], inp["qn_w"], inp["kvn_w"], lg["wqb"], lg["wqb_s"], inp["cos_sin"],
             inp["pos"], inp["slot"], swa, inp["swa_idx"], inp["swa_lens"], inp["topk"], inp["t2r"], inp["comp_bt"],
             swa_block=case.swa_block, swa_stride=case.swa_stride, comp_block=case.comp_block, ratio=case.ratio,
             heads=case.heads, fp8_dtype=fp8_dtype(case.target), fp8_max=448.0)
    return out, swa


# ---------------------------------------------------------------------------------- MXFP8


def _f32(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()


@pytest.mark.parametrize("fp8_max", [448.0, 224.0])
def test_mx_code_int_is_the_b4_rule(fp8_max):
    g = torch.Generator().manual_seed(3)
    edges = [ref.FLT_MIN, 2.0**-125, 1e-30, 1e-4, 0.5, 1.0, 1.75, 3.0, 1e30, 3e38]
    for k in range(-126 + 9, 120, 7):  # fp8_max * 2^k and its f32 neighbours
        v = fp8_max * 2.0**k
        edges += [v, float(torch.nextafter(torch.tensor(v), torch.tensor(0.0))),
                  float(torch.nextafter(torch.tensor(v), torch.tensor(float("inf"))))]
    rand = torch.randint(0x00800000, 0x7F7FFFFF, (200_000,), generator=g, dtype=torch.int32).view(torch.float32)
    a = torch.cat([torch.tensor(edges, dtype=torch.float32), rand])
    assert torch.equal(U.mx_code_int(a, fp8_max), ref.mx_code(a, fp8_max))


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_mxfp8_quantize_exact(target):
    from codegen.stages.mxfp8_quant import mx_fp8_max
    from codegen.targets import get_target

    g = torch.Generator().manual_seed(4)
    x = (torch.randn(5, 512, generator=g) * torch.logspace(-30, 30, 512)).bfloat16()
    x[1, 32:64] = 0.0  # an all-zero block: code 1
    x[2, :32] = 1e-38  # tiny (subnormal quotient)
    m = mx_fp8_max(get_target(target))
    q, codes = U.mxfp8_quantize_unfused(x, fp8_dtype(target), m)
    want_q, want_codes = ref.mxfp8_quantize(x, target)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(codes, want_codes)


def test_dequant_is_exact():
    case = dc.make_case(2, 4, 1, "sm90", seed=8)
    w, codes = case.logical["wqkv"], case.logical["wqkv_s"]
    d = U.mx_dequant(w[:64], codes[:2], 32)
    assert d.dtype == torch.bfloat16
    assert torch.equal(d.double(), ref._dequant_weight(w[:64], codes[:2]))
    assert U.e8m0_bf16(torch.tensor([0, 1, 127, 254])).float().tolist() == [2.0**-127, 2.0**-126, 1.0, 2.0**127]


# ---------------------------------------------------------------------------------- the chain

# (tokens, tp, ratio, pad rows, swa_block, swa block padding, seed)
CASES = [
    (1, 4, 1, (), 128, 0, 1),
    (6, 4, 2, (1, 4), 64, 64, 2),
    (17, 2, 0, (0, 16), 64, 8, 3),
]


@pytest.mark.parametrize("c", CASES, ids=lambda c: f"s{c[0]}-tp{c[1]}-r{c[2]}")
def test_chain_matches_reference(c):
    s, tp, ratio, pads, blk, pad, seed = c
    case = dc.make_case(s, tp, ratio, "sm90", seed=seed, swa_block=blk, pad_rows=pads, swa_pad=pad)
    out, swa = run_chain(case)
    assert out["q"].shape == (s, case.heads, ref.HEAD_DIM) and out["q"].dtype == torch.bfloat16
    assert out["kt"].shape == (s, ref.KEYS) and out["klen"].shape == (2 * s,) and out["kt"].dtype == torch.int32
    r = U.compare_with_reference(out, swa, case.inputs, case.logical, "sm90", case.heads, ratio, REL_ACC_CPU)
    assert all(v["ok"] for v in r.values()), {k: v for k, v in r.items() if not v["ok"]}
    assert r["kv_rope"]["rope_identical"] == 1.0  # eager: the contract's separate mul / add
    assert r["qkv_vs_exact"]["frac_le1"] == 1.0


def test_pad_rows_only_write_nothing():
    case = dc.make_case(3, 4, 1, "sm90", seed=5, pad_rows=(0, 1, 2))
    out, swa = run_chain(case)
    assert torch.equal(swa, case.inputs["swa"])
    assert out["klen"].tolist() == [0] * 6 and (out["kt"] == -1).all()


def test_compiles_as_one_graph():
    """torch.compile traces the whole chain without a graph break (the bench
    compiles it with inductor on the GPU; the eager backend checks the
    tracing here) and gives the same bits."""
    torch._dynamo.reset()
    case = dc.make_case(6, 4, 2, "sm90", seed=6, pad_rows=(2,))
    fn = torch.compile(U.attn_front_unfused, backend="eager", fullgraph=True, dynamic=False)
    a, swa_a = run_chain(case)
    b, swa_b = run_chain(case, fn)
    assert torch.equal(swa_a, swa_b)
    for k in a:
        assert torch.equal(a[k].view(torch.uint8) if a[k].dtype.itemsize == 1 else a[k],
                           b[k].view(torch.uint8) if b[k].dtype.itemsize == 1 else b[k]), k


def test_comparison_catches_wrong_outputs():
    case = dc.make_case(2, 4, 1, "sm90", seed=7)
    out, swa = run_chain(case)

    def failed(o=out, sw=swa):
        r = U.compare_with_reference(o, sw, case.inputs, case.logical, "sm90", case.heads, 1, REL_ACC_CPU)
        return sorted(k for k, v in r.items() if not v["ok"])

    assert failed() == []
    q = out["q"].clone()
    q[1, 3, 7] = q[1, 3, 7].float() * 1.03  # a few ulps off
    assert failed(dict(out, q=q)) == ["q"]
    bad = swa.clone()
    sl = int(case.inputs["slot"][0])
    bad[(sl // case.swa_block) * case.swa_stride + (sl % case.swa_block) * ref.RECORD_DATA + 5] ^= 1
    assert failed(sw=bad) == ["swa_exact"]
    kt = out["kt"].clone()
    kt[0, 0] += 1
    assert failed(dict(out, kt=kt)) == ["kt_exact"]
    qkv = out["qkv"].clone()
    qkv[0, 10] = qkv[0, 10].float() * 1.05
    assert "qkv_vs_exact" in failed(dict(out, qkv=qkv))


def test_compare_q_counts_input_flips():
    """Two q results from QX8 inputs one code apart agree only with the flips term."""
    case = dc.make_case(1, 4, 1, "sm90", seed=9)
    out, _ = run_chain(case)
    qx8 = out["qx8"].clone()
    j = int(out["qx8"][0].float().abs().argmax())
    qx8.view(torch.uint8)[0, j] -= 1  # one code smaller in magnitude
    lg = case.logical
    exact, _ = ref.mx_gemv(qx8, out["q_codes"], lg["wqb"], lg["wqb_s"])
    v = exact.float().bfloat16().float().reshape(out["q"].shape)
    q2 = ref.q_rope(v, case.inputs["pos"], case.inputs["cos_sin"]).bfloat16()
    r = U.compare_q(out["q"], out["qx8"], out["q_codes"], q2, qx8, out["q_codes"], lg["wqb"], lg["wqb_s"], REL_ACC_CPU)
    assert r["ok"] and r["flips"] == 1, r
    r = U.compare_q(out["q"], out["qx8"], out["q_codes"], q2, out["qx8"], out["q_codes"], lg["wqb"], lg["wqb_s"],
                    REL_ACC_CPU)
    assert not r["ok"], r
