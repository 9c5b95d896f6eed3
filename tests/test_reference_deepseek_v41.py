"""The DeepSeek-V4.1 attn_front reference (codegen/reference/deepseek_v41.py)
against independent scalar implementations of the contract's formulas (B.4 -
B.5.6): the MXFP8 bit rule and its edge cases, the FNUZ flavour's relation to
OCP, the exact dot product, the norms' reduction order, GPT-J RoPE, the
fp8_ds_mla record and its placement, the key table."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from codegen.fp import bf16_rn
from codegen.reference import deepseek_v41 as ref

OCP, FNUZ = "sm90", "gfx942"


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def scalar_code(amax: float, fp8_max: float) -> int:
    """B.4 by hand: exponent field of RN(max(amax, FLT_MIN) / fp8_max), +1 if any mantissa bit."""
    qd = float(np.float32(max(amax, ref.FLT_MIN)) / np.float32(fp8_max))
    b = bits(qd)
    return min(max(((b >> 23) & 0xFF) + (1 if b & 0x7FFFFF else 0), 0), 254)


# ---------------------------------------------------------------------------------- MXFP8


def test_ceil_exp_is_ceil_log2_for_normals():
    v = torch.tensor([1.0, 1.5, 2.0, 0.75, 3.0e-3, 448.0, 2.0**-126, 2.0**100 * 1.0001], dtype=torch.float32)
    want = [math.ceil(math.log2(float(x))) + 127 for x in v.tolist()]
    assert ref.ceil_exp(v).tolist() == want


def test_mx_code_edge_cases():
    # an all-zero block: FLT_MIN / 448 is subnormal -> code 1 (not the 0 the log2 formula clamps to)
    assert ref.mx_code(torch.tensor([0.0]), 448.0).tolist() == [1]
    assert ref.mx_code(torch.tensor([1e-40]), 448.0).tolist() == [1]
    # exactly 448 * 2^k -> 127 + k; a hair above -> one more
    assert ref.mx_code(torch.tensor([448.0, 896.0, 224.0]), 448.0).tolist() == [127, 128, 126]
    assert ref.mx_code(torch.tensor([f32(448.0 * (1 + 2**-20))]), 448.0).tolist() == [128]
    assert ref.mx_mul(torch.tensor([127, 1, 254])).tolist() == [1.0, 2.0**126, 0.0]
    assert ref.e8m0_scale(torch.tensor([0, 1, 127, 254])).tolist() == [2.0**-127, 2.0**-126, 1.0, 2.0**127]


@pytest.mark.parametrize("target", [OCP, FNUZ])
def test_mxfp8_matches_scalar_rule(target):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 256, generator=g) * torch.logspace(-6, 6, 256)).bfloat16()
    x[1, 32:64] = 0.0  # a zero block
    q, codes = ref.mxfp8_quantize(x, target)
    m = 224.0 if target == FNUZ else 448.0
    fp8 = torch.float8_e4m3fnuz if target == FNUZ else torch.float8_e4m3fn
    for r in range(3):
        for b in range(8):
            blk = x[r, 32 * b: 32 * b + 32].float()
            code = scalar_code(float(blk.abs().max()), m)
            assert codes[r, b].item() == code
            mul = struct.unpack("<f", struct.pack("<I", (254 - code) << 23))[0]
            want = torch.tensor([min(max(f32(float(v) * mul), -m), m) for v in blk.tolist()]).to(fp8)
            assert torch.equal(q[r, 32 * b: 32 * b + 32].view(torch.uint8), want.view(torch.uint8))
    assert codes[1, 1].item() == 1 and (q[1, 32:64].float() == 0).all()


def test_fnuz_is_ocp_with_codes_one_higher():
    """gfx942 (FNUZ, FP8_MAX 224): the same bytes as OCP at 448, codes one
    higher (Decision 1), for blocks of ordinary magnitude."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(8, 512, generator=g) * 3).bfloat16()
    qo, co = ref.mxfp8_quantize(x, OCP)
    qf, cf = ref.mxfp8_quantize(x, FNUZ)
    assert torch.equal(cf, co + 1)
    same = qo.view(torch.uint8) == qf.view(torch.uint8)
    # OCP -0 (0x80) is FNUZ's NaN: FNUZ writes +0 (0x00) there
    neg_zero = qo.view(torch.uint8) == 0x80
    assert (same | (neg_zero & (qf.view(torch.uint8) == 0))).all()
    assert torch.equal(ref.mxfp8_dequantize(qo, co), ref.mxfp8_dequantize(qf, cf))


def test_mxfp8_dequantize_is_close():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 1280, generator=g).bfloat16()
    q, c = ref.mxfp8_quantize(x, OCP)
    d = ref.mxfp8_dequantize(q, c)
    blocks = x.float().reshape(4, 40, 32).abs().amax(-1).repeat_interleave(32, -1).double()
    assert ((d - x.double()).abs() <= blocks * 2.0**-3).all()  # e4m3: 3 mantissa bits


# ---------------------------------------------------------------------------------- GEMV


def test_mx_gemv_is_the_exact_dot():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 64, generator=g).bfloat16()
    x8, xc = ref.mxfp8_quantize(x, OCP)
    w = (torch.randn(32, 64, generator=g) * 2).to(torch.float8_e4m3fn)
    wc = torch.randint(110, 130, (1, 2), generator=g, dtype=torch.int32)
    out, absdot = ref.mx_gemv(x8, xc, w, wc)
    for t in range(2):
        for r in (0, 7, 31):
            exact = sum(Fraction(float(x8[t, k].float())) * Fraction(2) ** (int(xc[t, k // 32]) - 127)
                        * Fraction(float(w[r, k].float())) * Fraction(2) ** (int(wc[0, k // 32]) - 127) for k in range(64))
            assert out[t, r].item() == float(exact)
            assert absdot[t, r].item() >= abs(float(exact))


def test_kernel_order_is_close_to_exact():
    g = torch.Generator().manual_seed(5)
    x8, xc = ref.mxfp8_quantize(torch.randn(3, 512, generator=g).bfloat16(), OCP)
    w = (torch.randn(64, 512, generator=g) * 2).to(torch.float8_e4m3fn)
    wc = torch.randint(118, 124, (2, 16), generator=g, dtype=torch.int32)
    exact, absdot = ref.mx_gemv(x8, xc, w, wc)
    for waves, chunk in ((16, 32), (8, 64)):
        k = ref.mx_gemv_kernel_order(x8, xc, w, wc, waves, chunk)
        assert k.dtype == torch.float32
        assert ((k.double() - exact).abs() <= 2.0**-22 * absdot).all()


def test_kernel_order_fma_is_the_two_rounding_order():
    """acc = fma(d, sx * sw, acc) (the kernels) gives the bits of acc + (d * sx) * sw, step by
    step in f32, while the scale products stay normal (the docstring's claim)."""
    g = torch.Generator().manual_seed(9)
    x8, xc = ref.mxfp8_quantize(torch.randn(2, 256, generator=g).bfloat16(), OCP)
    w = (torch.randn(32, 256, generator=g) * 2).to(torch.float8_e4m3fn)
    wc = torch.randint(110, 130, (1, 8), generator=g, dtype=torch.int32)
    got = ref.mx_gemv_kernel_order(x8, xc, w, wc, 2, 32)
    d = torch.einsum("sbk,nbk->snb", x8.double().reshape(2, 8, 32), w.double().reshape(32, 8, 32)).float()
    sx, sw = ref.e8m0_scale(xc.to(torch.int32)), ref.e8m0_scale(wc.to(torch.int32)).repeat_interleave(32, 0)
    total = torch.zeros(2, 32)
    for wave in range(2):
        acc = torch.zeros(2, 32)
        for b in range(wave, 8, 2):
            acc = acc + (d[:, :, b] * sx[:, None, b]) * sw[None, :, b]
        total = total + acc
    assert torch.equal(got, total)


# ---------------------------------------------------------------------------------- norms


def test_front_norms_order_by_hand():
    g = torch.Generator().manual_seed(6)
    qkv = bf16_rn(torch.randn(2, ref.QKV_ROWS, generator=g) * 3)
    qn = (1 + 0.1 * torch.randn(ref.Q_RANK, generator=g)).bfloat16()
    kvn = (1 + 0.1 * torch.randn(ref.KV_DIM, generator=g)).bfloat16()
    ys, kn = ref.front_norms(qkv, qn, kvn)
    f = np.float32
    for t in range(2):
        row = qkv[t].numpy().astype(np.float32)

        def total(vals, per):
            lanes = np.zeros(256, dtype=np.float32)
            for tt in range(len(vals) // per):
                s = f(vals[tt * per] * vals[tt * per])
                for j in range(1, per):
                    s = f(s + f(vals[tt * per + j] * vals[tt * per + j]))
                lanes[tt] = s
            groups = []
            for gi in range(8):
                v = lanes[32 * gi: 32 * gi + 32].copy()
                for off in (16, 8, 4, 2, 1):
                    v = (v + v[np.arange(32) ^ off]).astype(np.float32)
                groups.append(v[0])
            G = groups
            return f(f(f(G[0] + G[1]) + f(G[2] + G[3])) + f(f(G[4] + G[5]) + f(G[6] + G[7])))

        for vals, n, w, out in ((row[:1280], 1280, qn, ys), (row[1280:], 512, kvn, kn)):
            tot = total(vals, 8 if n == 1280 else 2)
            r = f(f(1.0) / np.sqrt(f(f(tot / f(n)) + f(1e-20))))
            want = bf16_rn(torch.from_numpy((vals * r).astype(np.float32)) * w.float())
            assert torch.equal(out[t], want)


# ---------------------------------------------------------------------------------- RoPE, record


def _cos_sin(n=64):
    ang = torch.arange(n, dtype=torch.float64)[:, None] * (1.0 / 10000 ** (torch.arange(0, 64, 2) / 64.0))[None, :]
    return torch.cat([ang.cos(), ang.sin()], 1).float()


def test_gptj_rope_pairs():
    cs = _cos_sin()
    v = bf16_rn(torch.randn(2, 512))
    pos = torch.tensor([5, 2**32 + 7])  # the low word: 7
    out = ref.kv_rope(v, pos, cs)
    assert torch.equal(out[:, :448], v[:, :448])
    for t, p in ((0, 5), (1, 7)):
        for j in (0, 13, 31):
            c, s = cs[p, j], cs[p, 32 + j]
            v0, v1 = v[t, 448 + 2 * j], v[t, 449 + 2 * j]
            assert out[t, 448 + 2 * j] == bf16_rn(v0 * c - v1 * s)
            assert out[t, 449 + 2 * j] == bf16_rn(v0 * s + v1 * c)
    q = bf16_rn(torch.randn(1, 3, 512))
    qr = ref.q_rope(q, pos[:1], cs)
    assert torch.equal(qr[0, 1], ref.kv_rope(q[0, 1:2], pos[:1], cs)[0])


@pytest.mark.parametrize("target", [OCP, FNUZ])
def test_kv_record_layout(target):
    g = torch.Generator().manual_seed(7)
    e = bf16_rn(torch.randn(2, 512, generator=g) * torch.logspace(-3, 2, 512))
    e[1, 64:128] = 0.0  # floor: amax 1e-4
    data, scale = ref.kv_record(e, target)
    m = 224.0 if target == FNUZ else 448.0
    fp8 = torch.float8_e4m3fnuz if target == FNUZ else torch.float8_e4m3fn
    assert data.shape == (2, 576) and scale.shape == (2, 8) and (scale[:, 7] == 0).all()
    for t in range(2):
        for b in range(7):
            blk = e[t, 64 * b: 64 * b + 64]
            code = bits(float(np.float32(max(float(blk.abs().max()), f32(1e-4))) / np.float32(m)))
            code = ((code >> 23) & 0xFF) + (1 if code & 0x7FFFFF else 0)
            assert scale[t, b].item() == code
            mul = 2.0 ** (127 - code)
            want = (blk * mul).clamp(-m, m).to(fp8).view(torch.uint8)
            assert torch.equal(data[t, 64 * b: 64 * b + 64], want)
        assert torch.equal(data[t, 448:].view(torch.bfloat16).float(), e[t, 448:])


def test_insert_records_places_and_skips():
    blk, stride = 4, 4 * 584 + 16
    swa = torch.randint(0, 256, (3 * stride,), dtype=torch.uint8)
    data = torch.arange(3 * 576).reshape(3, 576).to(torch.uint8)
    scale = torch.arange(3 * 8).reshape(3, 8).to(torch.uint8) + 100
    slot = torch.tensor([5, -1, 2**32 + 11])  # block 1 offset 1; pad; the low word 11: block 2 offset 3
    out = ref.insert_records(swa, slot, data, scale, blk, stride)
    changed = (out != swa).nonzero().flatten()
    b1, b2 = stride + 576, 2 * stride + 3 * 576
    assert torch.equal(out[b1: b1 + 576], data[0]) and torch.equal(out[b2: b2 + 576], data[2])
    s1, s2 = stride + blk * 576 + 8, 2 * stride + blk * 576 + 24
    assert torch.equal(out[s1: s1 + 8], scale[0]) and torch.equal(out[s2: s2 + 8], scale[2])
    allowed = set(range(b1, b1 + 576)) | set(range(b2, b2 + 576)) | set(range(s1, s1 + 8)) | set(range(s2, s2 + 8))
    assert set(changed.tolist()) <= allowed


# ---------------------------------------------------------------------------------- key table


def scalar_key_table(pos, slot, swa_idx, swa_lens, topk, t2r, comp_bt, comp_block, ratio):
    s = len(pos)
    cols = comp_bt.shape[1]
    flat = comp_bt.reshape(-1).tolist()
    kt, klen = [], [0] * (2 * s)
    for t in range(s):
        p = int(ref.low_word(pos[t:t + 1]))
        live = int(ref.low_word(slot[t:t + 1])) >= 0
        nswa = int(swa_lens[t]) if live else 0
        ntopk = min(int((p + 1) / ratio), 512) if ratio > 0 and live else 0
        kv_len = ntopk + nswa
        row = []
        for k in range(640):
            if k < ntopk:
                local = int(topk[t, k])
                if local >= 0:
                    v = (flat[int(t2r[t]) * cols + local // comp_block] * comp_block + local % comp_block) | (1 << 31)
                    row.append(v - (1 << 32) if v >= 1 << 31 else v)
                else:
                    row.append(-1)
            elif k < kv_len:
                row.append(int(swa_idx[t, 0, min(k - ntopk, 127)]))
            else:
                row.append(-1)
        kt.append(row)
        klen[t], klen[s + t] = kv_len, ntopk
    return torch.tensor(kt, dtype=torch.int32), torch.tensor(klen, dtype=torch.int32)


@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_key_table_matches_scalar(ratio):
    g = torch.Generator().manual_seed(8 + ratio)
    s, reqs, cols = 7, 3, 8
    comp_block = {0: 1, 1: 128, 2: 64}[ratio]
    pos = torch.randint(0, 2000, (s,), generator=g)
    pos[0] = 100
    pos[1] = 2**32 + 3  # the low word: 3
    slot = torch.randint(0, 5000, (s,), generator=g)
    slot[2] = -1  # pad row
    swa_idx = torch.randint(0, 1 << 20, (s, 1, 128), generator=g, dtype=torch.int32)
    swa_lens = torch.randint(0, 129, (s,), generator=g, dtype=torch.int32)
    topk = torch.randint(-1, cols * comp_block, (s, 512), generator=g, dtype=torch.int32)
    t2r = torch.randint(0, reqs, (s,), generator=g, dtype=torch.int32)
    comp_bt = torch.randint(0, 1 << 24, (reqs, cols), generator=g, dtype=torch.int32)  # block * comp_block wraps
    got = ref.key_table(pos, slot, swa_idx, swa_lens, topk, t2r, comp_bt, comp_block, ratio)
    want = scalar_key_table(pos, slot, swa_idx, swa_lens, topk, t2r, comp_bt, comp_block, ratio)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[1][2].item() == 0 and (got[0][2] == -1).all()  # the pad row


# ---------------------------------------------------------------------------------- the chain


def test_attn_front_shapes_and_consistency():
    g = torch.Generator().manual_seed(9)
    s, heads = 2, ref.local_heads(4)
    x = torch.randn(s, ref.HIDDEN, generator=g).bfloat16()
    wqkv = (torch.randn(ref.QKV_ROWS, ref.HIDDEN, generator=g) * 1.5).to(torch.float8_e4m3fn)
    wqkv_s = torch.randint(116, 122, (ref.QKV_ROWS // 32, ref.HIDDEN // 32), generator=g, dtype=torch.int32)
    wqb = (torch.randn(heads * 512, ref.Q_RANK, generator=g) * 1.5).to(torch.float8_e4m3fn)
    wqb_s = torch.randint(116, 122, (heads * 16, 40), generator=g, dtype=torch.int32)
    qn, kvn = torch.ones(ref.Q_RANK).bfloat16(), torch.ones(ref.KV_DIM).bfloat16()
    out = ref.attn_front(x, wqkv, wqkv_s, qn, kvn, wqb, wqb_s, _cos_sin(), torch.tensor([3, 9]), torch.tensor([0, 1]),
                         OCP, heads)
    assert out["q"].shape == (s, heads, 512) and out["record_data"].shape == (s, 576)
    assert torch.equal(out["q"], bf16_rn(out["q"]))
    # unit norm weights: the normed latent has mean square ~1
    assert torch.allclose(out["ys"].pow(2).mean(1), torch.ones(s), rtol=0.02)
    assert ref.local_heads(2) == 32
    with pytest.raises(ValueError):
        ref.local_heads(8)


def test_qkv_of_partials_order():
    """B.5.2: halves P_0 + P_1; quarters (P_0 + P_1) + (P_2 + P_3), then one bf16 rounding."""
    from codegen.fp import bf16_rn
    g = torch.Generator().manual_seed(5)
    p = torch.randn(4, 3, ref.QKV_ROWS, generator=g) * torch.logspace(-3, 3, ref.QKV_ROWS)
    assert torch.equal(ref.qkv_of_partials(p[:2]), bf16_rn(p[0] + p[1]))
    assert torch.equal(ref.qkv_of_partials(p), bf16_rn((p[0] + p[1]) + (p[2] + p[3])))
    import pytest
    with pytest.raises(ValueError, match="2 or 4 K parts"):
        ref.qkv_of_partials(p[:3])

