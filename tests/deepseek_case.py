"""One DeepSeek-V4.1 attn_front test case: random inputs (never zeros), the
launch arguments (outputs poisoned, the SWA cache full of canary bytes), the
kernel's mailboxes read back from scratch, and the checks against
``codegen.reference.deepseek_v41`` (contract C.2's exactness classes):

* exact: KT / KLEN; X8 / X8S (xq builds); QX8 / QX8S given the kernel's own
  partials; the whole SWA byte cache (records at live slots given the
  kernel's own kv values, every other byte its canary); qr_out (index);
  every mailbox tag of the launch.
* tolerance: the wqkv partials against the exact dot products,
  ``|P - exact| <= d = 2^-22 * absdot`` (absdot = sum |x w|: the f32 sums' and
  the MMA's rounding; measured on H200: <= 2^-24.7), ``2^-12 * absdot`` for a
  GEMV on sm90's native fp8 wgmma (``gemv_tol``); q against the exact
  wq_b of the kernel's own QX8, rounded as the contract says (bf16, RoPE in
  f32, bf16): ``|q - ref| <= ulp(ref) + d`` at NoPE dims and ``ulp(ref) +
  2 (ulp(max |v0|, |v1|) + d)`` at RoPE dims (v: the pair's bf16 GEMV values;
  one bf16 rounding may flip by an ulp, the rotation adds both errors).

``simulate`` fills the same buffers from the reference (the kernel's order:
``mx_gemv_kernel_order``), so that the checks themselves are tested on a CPU."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import codegen
from codegen.fp import bf16_rn, fp8_dtype
from codegen.reference import deepseek_v41 as ref
from codegen.reference.minimax_m3 import bf16_ulp_diff
from codegen.targets import get_target
from codegen.weights import preshuffle_mx

POISON_I32 = 0x7EADBEEF
POISON_BF16 = -1  # 0xffff: a NaN pattern no output equals
MAX_POS = 4096
PARTIAL_TOL = 2.0**-22  # of absdot: the MMA's and the f32 sums' rounding (measured on H200: <= 2^-24.7)
# of absdot, a GEMV on wgmma (sm90's native fp8 wgmma keeps about 13 bits of a 32-value block's
# sum: up to 2^-12.8 of the block's sum |w x|, scripts/probe_wgmma_fp8.py; README "Precision")
WGMMA_TOL = 2.0**-12


@dataclass
class Case:
    tokens: int
    tp: int
    ratio: int
    target: str
    swa_block: int
    swa_stride: int
    comp_block: int
    inputs: dict = field(default_factory=dict)  # CPU tensors / ints by ABI name, logical weights
    logical: dict = field(default_factory=dict)  # wqkv, wqkv_s, wqb, wqb_s (logical, codes)

    @property
    def heads(self) -> int:
        return ref.local_heads(self.tp)


def _fp8_weight(n: int, k: int, g: torch.Generator, target) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp8 [n, k] weight of unit-ish bytes and E8M0 codes per 32 x 32 block near 2^-8."""
    t = get_target(target)
    w = (torch.randn(n, k, generator=g) * 1.5).clamp(-t.fp8_max, t.fp8_max).to(fp8_dtype(t))
    codes = torch.randint(116, 122, (n // 32, k // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    return w, codes


def make_case(tokens: int, tp: int, ratio: int, target: str, seed: int, swa_block: int = 128,
              pad_rows: tuple[int, ...] = (), swa_pad: int = 0) -> Case:
    """Random inputs; ``pad_rows``: tokens with slot -1 (no record, KLEN 0);
    ``swa_pad``: bytes of padding after each SWA block (swa_stride > swa_block * 584)."""
    g = torch.Generator().manual_seed(seed)
    s = tokens
    blocks = max(4, 2 * s // swa_block + 2)
    swa_stride = swa_block * ref.RECORD_DATA + swa_block * ref.RECORD_SCALE + swa_pad
    comp_block = {0: 1, 1: 128, 2: 64}[ratio]
    case = Case(s, tp, ratio, target, swa_block, swa_stride, comp_block)
    wqkv, wqkv_s = _fp8_weight(ref.QKV_ROWS, ref.HIDDEN, g, target)
    wqb, wqb_s = _fp8_weight(case.heads * ref.HEAD_DIM, ref.Q_RANK, g, target)
    case.logical = {"wqkv": wqkv, "wqkv_s": wqkv_s, "wqb": wqb, "wqb_s": wqb_s}
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, ref.ROPE_DIM, 2, dtype=torch.float64) / ref.ROPE_DIM))
    ang = torch.arange(MAX_POS, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([ang.cos(), ang.sin()], dim=1).float()
    pos = torch.randint(0, 1500, (s,), generator=g, dtype=torch.int64)
    slots = torch.randperm(blocks * swa_block, generator=g)[:s].to(torch.int64)
    for t in pad_rows:
        if t < s:
            slots[t] = -1
    reqs = max(1, (s + 2) // 3)
    cols = 16
    topk = torch.randint(0, 1600, (s, ref.TOPK), generator=g, dtype=torch.int32)
    topk[torch.rand(s, ref.TOPK, generator=g) < 0.05] = -1
    case.inputs = {
        "x": (torch.randn(s, ref.HIDDEN, generator=g)).bfloat16(),
        "x_stride": ref.HIDDEN,
        "qn_w": (1.0 + 0.2 * torch.randn(ref.Q_RANK, generator=g)).bfloat16(),
        "kvn_w": (1.0 + 0.2 * torch.randn(ref.KV_DIM, generator=g)).bfloat16(),
        "cos_sin": cos_sin,
        "pos": pos,
        "slot": slots,
        "swa": torch.randint(0, 256, (blocks * swa_stride,), generator=g, dtype=torch.uint8),  # canaries
        "swa_stride": swa_stride,
        "swa_block": swa_block,
        "swa_idx": torch.randint(0, 1 << 20, (s, 1, ref.WINDOW), generator=g, dtype=torch.int32),
        "swa_lens": torch.randint(0, ref.WINDOW + 1, (s,), generator=g, dtype=torch.int32),
        "comp_block": comp_block,
        "comp_bt": torch.randint(0, 1 << 16, (reqs, cols), generator=g, dtype=torch.int32),
        "bt_stride": cols,
        "topk": topk.clamp(max=cols * comp_block - 1),
        "t2r": torch.randint(0, reqs, (s,), generator=g, dtype=torch.int32),
    }
    return case


def launch_args(case: Case, ws: dict, device="cuda") -> dict:
    """The kernel's keyword arguments: inputs on ``device``, weights MX-preshuffled
    for the target, outputs poisoned, workspace from ``kernel.workspace``."""
    inp = {k: (v.to(device).clone() if isinstance(v, torch.Tensor) else v) for k, v in case.inputs.items()}
    s, lg = case.tokens, case.logical
    inp["wqkv"] = preshuffle_mx(lg["wqkv"], case.target).to(device)
    inp["wqkv_s"] = lg["wqkv_s"].to(device)
    inp["wqb"] = preshuffle_mx(lg["wqb"], case.target).to(device)
    inp["wqb_s"] = lg["wqb_s"].to(device)
    inp["q"] = torch.full((s, case.heads, ref.HEAD_DIM), POISON_BF16, dtype=torch.int16, device=device).view(torch.bfloat16)
    inp["qr_out"] = torch.full((s, ref.Q_RANK), POISON_BF16, dtype=torch.int16, device=device).view(torch.bfloat16)
    inp["kt"] = torch.full((s, ref.KEYS), POISON_I32, dtype=torch.int32, device=device)
    inp["klen"] = torch.full((2 * s,), POISON_I32, dtype=torch.int32, device=device)
    inp["layer"] = 3
    inp.update(ws)
    return inp


def _region(ir, raw: torch.Tensor, name: str) -> torch.Tensor:
    r = ir.region(name)
    return raw[r.offset: r.offset + r.nbytes]


def image_offsets(tokens: int, k: int, groups: int) -> torch.Tensor:
    """Byte offsets ``[tokens, k]`` of rows stored as a wgmma GEMV's LDS image (QX8: qkv
    ``image``, X8: xq ``image``): the 128-byte-swizzled K-major layout of ``groups`` 8-token
    groups, token t's 16-byte piece p of K at ((p / 8) * groups + t / 8) * 1024 + (t % 8) * 128 +
    ((p % 8) ^ (t % 8)) * 16 (the sm90 library's swizzle128_word, in bytes)."""
    t = torch.arange(tokens).view(-1, 1)
    b = torch.arange(k).view(1, -1)
    p = b // 16
    return ((p // 8) * groups + t // 8) * 1024 + (t % 8) * 128 + ((p % 8) ^ (t % 8)) * 16 + b % 16


def _image_groups(ir, kind: str) -> int:
    """The image groups of the build's stage of ``kind`` that publishes rows (mla_norm_rope: QX8,
    mxfp8_quant: X8; 0: row-major, token t at byte t * K, or no such stage)."""
    return next((st.values["image_groups"] for st in ir.stages if st.kind == kind), 0)


def _rows(ir, raw: torch.Tensor, name: str, kind: str, tokens: int, k: int) -> torch.Tensor:
    """Region ``name``'s rows ``[tokens, k]`` (bytes), from its image where the build stores one."""
    region, groups = _region(ir, raw, name), _image_groups(ir, kind)
    return region[image_offsets(tokens, k, groups)] if groups else region[: tokens * k].view(tokens, k)


def tagged_qx8(ir) -> bool:
    """Whether the build's qkv stage stores QX8 and its codes as tagged pairs (``tagged``: pair i
    holds word i of the plain layout, with the launch's tag; no QRDY flags)."""
    return next(st for st in ir.stages if st.kind == "mla_norm_rope").values["tagged"]


def tagged_copies(ir) -> int:
    """How many copies of the tagged pairs the build stores (``tagged_copies``; 1 untagged)."""
    return next(st for st in ir.stages if st.kind == "mla_norm_rope").values["tagged_copies"]


def _qx8(ir, raw: torch.Tensor, tokens: int) -> dict:
    """QX8 [tokens, Q_RANK] (bytes) and QX8S [tokens, Q_RANK / 32] (int32) from the scratch, and,
    where the build stores them as tagged pairs, the pairs' tags (else None) and whether every
    further copy of the pairs (``tagged_copies``) is the first one, values and tags."""
    words, codes = _region(ir, raw, "qx8"), _region(ir, raw, "qx8s").view(torch.int32)
    if not tagged_qx8(ir):
        return {"qx8": _rows(ir, raw, "qx8", "mla_norm_rope", tokens, ref.Q_RANK),
                "qx8s": codes[: tokens * ref.Q_RANK // 32].view(tokens, ref.Q_RANK // 32), "qx8_tag": None, "qx8s_tag": None,
                "qx8_copies_same": None}
    copies, n, nc = tagged_copies(ir), tokens * ref.Q_RANK // 4, tokens * ref.Q_RANK // 32
    every, cevery = words.view(torch.int32).view(-1, 2)[: copies * n], codes.view(-1, 2)[: copies * nc]
    pairs, cpairs = every[:n], cevery[:nc]
    same = all(torch.equal(every[c * n:(c + 1) * n], pairs) and torch.equal(cevery[c * nc:(c + 1) * nc], cpairs)
               for c in range(1, copies))
    return {"qx8_copies_same": torch.tensor(same),
            "qx8": pairs[:, 0].contiguous().view(torch.uint8).view(tokens, ref.Q_RANK),
            "qx8s": cpairs[:, 0].contiguous().view(tokens, ref.Q_RANK // 32),
            "qx8_tag": pairs[:, 1].contiguous().view(tokens, ref.Q_RANK // 4),
            "qx8s_tag": cpairs[:, 1].contiguous().view(tokens, ref.Q_RANK // 32)}


def _put_qx8(ir, raw: torch.Tensor, qx8: torch.Tensor, qs: torch.Tensor, tag: int) -> None:
    """QX8 (fp8 [tokens, Q_RANK]) and its codes into the scratch as the build stores them (tagged
    pairs with ``tag``, or words, at the image's places where it stores one)."""
    if not tagged_qx8(ir):
        _put_rows(ir, raw, "qx8", "mla_norm_rope", qx8)
        _region(ir, raw, "qx8s").view(torch.int32).copy_(qs.reshape(-1))
        return
    for name, words in (("qx8", qx8.contiguous().view(torch.uint8).view(-1).view(torch.int32)),
                        ("qx8s", qs.reshape(-1).to(torch.int32))):
        pairs = torch.stack([words, torch.full_like(words, tag)], -1).reshape(-1).repeat(tagged_copies(ir))
        _region(ir, raw, name).view(torch.int32)[: pairs.numel()].copy_(pairs)


def _put_rows(ir, raw: torch.Tensor, name: str, kind: str, rows: torch.Tensor) -> None:
    """Rows ``[tokens, k]`` (fp8) into region ``name``, at its image's places where the build stores one."""
    region, groups = _region(ir, raw, name), _image_groups(ir, kind)
    flat = rows.view(torch.uint8).reshape(-1)
    if groups:
        region[image_offsets(rows.shape[0], rows.shape[1], groups).reshape(-1)] = flat
    else:
        region[: flat.numel()].copy_(flat)


def read_scratch(ir, scratch: torch.Tensor, tokens: int) -> dict:
    """The kernel's mailboxes: partials [K_PARTS, S, 1792] (f32 + tags), X8 / X8S, QX8 / QX8S, flag tags."""
    raw = scratch.cpu()
    s = tokens
    fp8 = fp8_dtype(ir.target)
    qkvp = _region(ir, raw, "qkvp").view(torch.int32).view(_const(ir, "K_PARTS"), s, ref.QKV_ROWS, 2)
    return {
        "partials": qkvp[..., 0].contiguous().view(torch.float32).clone(),
        "partials_tag": qkvp[..., 1].clone(),
        "x8": _rows(ir, raw, "x8", "mxfp8_quant", s, ref.HIDDEN).view(fp8).clone(),
        "x8s": _region(ir, raw, "x8s").view(torch.int32).view(s, ref.HIDDEN // 32).clone(),
        **{k: (v.view(fp8) if k == "qx8" else v).clone() for k, v in _qx8(ir, raw, s).items() if v is not None},
        "xrdy": _region(ir, raw, "xrdy").view(torch.int32).view(-1, 2).clone(),
        "qrdy": _region(ir, raw, "qrdy").view(torch.int32).view(-1, 2).clone(),
    }


def _const(ir, name):
    return next(c.value for c in ir.constants if c.name == name)


def gemv_tol(ir, stage: str) -> float:
    """A GEMV stage's bound, of sum |w x|: the native fp8 wgmma's (about 13 bits of each block's
    sum), else the exact block sums' f32 rounding."""
    return WGMMA_TOL if next(st for st in ir.stages if st.name == stage).values.get("wgmma") else PARTIAL_TOL


def from_partials(parts: torch.Tensor, inp: dict, target) -> tuple:
    """What the contract computes from the wqkv partials ``[K_PARTS, S, 1792]`` (B.5.2, B.5.3, QX8):
    ``(qkv, ys, kn, qx8, qs)``."""
    qkv = ref.qkv_of_partials(parts)
    ys, kn = ref.front_norms(qkv, inp["qn_w"], inp["kvn_w"])
    qx8, qs = ref.mxfp8_quantize(ys, target)
    return qkv, ys, kn, qx8, qs


def publishes_qx8(ir) -> bool:
    """Whether the build's qkv stage writes QX8 and its flags (else wq_b norms q itself:
    q_inline, and QX8 is never in the scratch)."""
    return next(st for st in ir.stages if st.kind == "mla_norm_rope").values["publish"]


def simulate(case: Case, ir, args: dict) -> None:
    """What the kernel writes, computed by the reference in the kernel's order,
    into ``args`` (CPU tensors): scratch mailboxes (tag of epoch 0), q, kt, klen,
    qr_out, swa. Tests the checks, not the kernel."""
    s, target = case.tokens, case.target
    inp, lg = case.inputs, case.logical
    tag = 1
    raw = args["scratch"]
    x8, sx = ref.mxfp8_quantize(inp["x"], target)
    waves = ir.threads // ir.target.wave_size
    chunk = 32 if ir.target.vendor == "nvidia" else 64
    n_parts = _const(ir, "K_PARTS")
    kp = ref.HIDDEN // n_parts
    parts = []
    for p in range(n_parts):
        ks = slice(p * kp, (p + 1) * kp)
        parts.append(ref.mx_gemv_kernel_order(x8[:, ks], sx[:, p * kp // 32:(p + 1) * kp // 32],
                                              lg["wqkv"][:, ks], lg["wqkv_s"][:, p * kp // 32:(p + 1) * kp // 32],
                                              waves, chunk))
    parts = torch.stack(parts)
    pairs = torch.stack([parts.view(torch.int32), torch.full((n_parts, s, ref.QKV_ROWS), tag, dtype=torch.int32)], -1)
    _region(ir, raw, "qkvp").view(torch.int32).copy_(pairs.reshape(-1))
    if any(st.name == "xq" for st in ir.stages):
        _put_rows(ir, raw, "x8", "mxfp8_quant", x8)
        _region(ir, raw, "x8s").view(torch.int32).copy_(sx.reshape(-1))
    _, ys, kn, qx8, qs = from_partials(parts, inp, target)
    publish = publishes_qx8(ir)
    if publish:
        _put_qx8(ir, raw, qx8, qs, tag)
    for name in ("xrdy", "qrdy") if publish and not tagged_qx8(ir) else ("xrdy",):
        fl = _region(ir, raw, name).view(torch.int32).view(-1, 2)
        fl[:, 0], fl[:, 1] = 1, tag
    qv = bf16_rn(ref.mx_gemv_kernel_order(qx8, qs, lg["wqb"], lg["wqb_s"], waves, chunk))
    args["q"].copy_(ref.q_rope(qv.reshape(s, case.heads, ref.HEAD_DIM), inp["pos"], inp["cos_sin"]).bfloat16())
    data, scale = ref.kv_record(ref.kv_rope(kn, inp["pos"], inp["cos_sin"]), target)
    args["swa"].copy_(ref.insert_records(inp["swa"], inp["slot"], data, scale, case.swa_block, case.swa_stride))
    if _const(ir, "INDEX"):
        args["qr_out"].copy_(ys.bfloat16())
    else:
        kt, klen = ref.key_table(inp["pos"], inp["slot"], inp["swa_idx"], inp["swa_lens"], inp["topk"],
                                 inp["t2r"], inp["comp_bt"], case.comp_block, case.ratio)
        args["kt"].copy_(kt)
        args["klen"].copy_(klen)
    ir.advance(args["epoch"])


def check(case: Case, ir, args: dict, epoch: int = 0) -> dict:
    """Every check of the module docstring on the kernel's outputs (``args``
    after the launch, any device) for the launch of ``epoch``; returns stats."""
    s, target = case.tokens, case.target
    inp, lg = case.inputs, case.logical
    tag = 2 * epoch + 1
    got = read_scratch(ir, args["scratch"], s)
    stats = {}
    fails: list[str] = []

    def expect(ok, message):
        if not bool(ok):
            fails.append(message() if callable(message) else message)

    index = _const(ir, "INDEX")
    copies, q_stride = _const(ir, "FLAG_COPIES"), _const(ir, "QRDY_STRIDE")

    # key table (exact), or untouched in index builds
    kt, klen = args["kt"].cpu(), args["klen"].cpu()
    if index:
        expect((kt == POISON_I32).all() and (klen == POISON_I32).all(), "index builds leave the key table alone")
    else:
        want_kt, want_klen = ref.key_table(inp["pos"], inp["slot"], inp["swa_idx"], inp["swa_lens"], inp["topk"],
                                           inp["t2r"], inp["comp_bt"], case.comp_block, case.ratio)
        expect(torch.equal(klen, want_klen), f"KLEN {klen.tolist()} != {want_klen.tolist()}")
        bad = (kt != want_kt).nonzero()
        expect(bad.numel() == 0, lambda: f"KT differs at {bad.shape[0]} entries, first {bad[:5].tolist()}: "
               f"{kt[tuple(bad[0])]} vs {want_kt[tuple(bad[0])]}")

    # input quant (exact), where it went through the mailbox
    x8, sx = ref.mxfp8_quantize(inp["x"], target)
    if any(st.name == "xq" for st in ir.stages):
        expect(torch.equal(got["x8"].view(torch.uint8), x8.view(torch.uint8)), "X8 bytes")
        expect(torch.equal(got["x8s"], sx), "X8S codes")
        x_stride = _const(ir, "XRDY_STRIDE")
        tags = got["xrdy"].view(-1, x_stride, 2)[:copies, : 2 * s]
        expect((tags[..., 1] == tag).all() and (tags[..., 0] == 1).all(), "XRDY flags (every copy)")

    # wqkv partials within tolerance of the exact dot products
    expect((got["partials_tag"] == tag).all(), "some partials were not written by this launch")
    n_parts = _const(ir, "K_PARTS")
    kp = ref.HIDDEN // n_parts
    partial_tol = gemv_tol(ir, "wqkv_a")
    worst = 0.0
    for p in range(n_parts):
        ks, bs = slice(p * kp, (p + 1) * kp), slice(p * kp // 32, (p + 1) * kp // 32)
        exact, absdot = ref.mx_gemv(x8[:, ks], sx[:, bs], lg["wqkv"][:, ks], lg["wqkv_s"][:, bs])
        err = (got["partials"][p].double() - exact).abs()
        expect(torch.isfinite(got["partials"][p]).all(), 'torch.isfinite(got["partials"][p]).all()')
        worst = max(worst, (err / (absdot + 1e-300)).max().item())
        expect((err <= partial_tol * absdot + 2.0**-149).all(), f"partials part {p}: max err {(err / absdot).max().item():.3g} of absdot")
    stats["partial_err_of_absdot"] = worst
    waves, chunk = ir.threads // ir.target.wave_size, (32 if ir.target.vendor == "nvidia" else 64)
    emu = ref.mx_gemv_kernel_order(x8[:, :kp], sx[:, : kp // 32], lg["wqkv"][:, :kp], lg["wqkv_s"][:, : kp // 32],
                                   waves, chunk)
    stats["partials_emulated_exact_frac"] = (emu == got["partials"][0]).float().mean().item()

    # QX8 / QX8S (exact) given the kernel's own partials
    _, ys, kn, qx8, qs = from_partials(got["partials"], inp, target)
    if publishes_qx8(ir):
        bad = (got["qx8"].view(torch.uint8) != qx8.view(torch.uint8)).nonzero()
        expect(bad.numel() == 0, f"QX8 differs at {bad[:5].tolist()} ({bad.shape[0]} bytes)")
        expect(torch.equal(got["qx8s"], qs), "QX8S codes")
        if tagged_qx8(ir):  # each pair its own flag: all of this launch
            expect((got["qx8_tag"] == tag).all() and (got["qx8s_tag"] == tag).all(), "QX8 / QX8S pairs' tags")
            expect(bool(got["qx8_copies_same"]), "QX8 / QX8S pairs' copies (tagged_copies) differ from the first")
        else:
            tags = got["qrdy"].view(-1, q_stride, 2)[:copies, :s]
            expect((tags[..., 1] == tag).all() and (tags[..., 0] == 1).all(), "QRDY flags (every copy)")
        q_in, q_codes = got["qx8"], got["qx8s"]
    else:  # q_inline: wq_b's CTAs computed QX8 in LDS (test_q_inline_same_bits: the published bits)
        q_in, q_codes = qx8, qs
    if index:
        want = ys.bfloat16().view(torch.int16)
        expect(torch.equal(args["qr_out"].cpu().view(torch.int16), want), "qr_out")

    # the SWA cache: records at live slots (exact, given the kernel's kv), canaries elsewhere
    data, scale = ref.kv_record(ref.kv_rope(kn, inp["pos"], inp["cos_sin"]), target)
    want_swa = ref.insert_records(inp["swa"], inp["slot"], data, scale, case.swa_block, case.swa_stride)
    swa = args["swa"].cpu()
    bad = (swa != want_swa).nonzero().flatten()
    expect(bad.numel() == 0, f"SWA cache differs at {bad.numel()} bytes, first {bad[:8].tolist()}")

    # q within tolerance of the exact wq_b of the kernel's own QX8
    wqb_tol = gemv_tol(ir, "wq_b")
    exact, absdot = ref.mx_gemv(q_in, q_codes, lg["wqb"], lg["wqb_s"])
    v = bf16_rn(exact.float()).reshape(s, case.heads, ref.HEAD_DIM)
    q_ref = ref.q_rope(v, inp["pos"], inp["cos_sin"])
    q = args["q"].cpu().float()
    expect(torch.isfinite(q).all(), "q has NaN / inf (unwritten rows?)")
    pair = lambda t: t.reshape(s, case.heads, ref.HEAD_DIM // 2, 2).amax(-1).repeat_interleave(2, -1)  # noqa: E731
    d = wqb_tol * pair(absdot.reshape(s, case.heads, ref.HEAD_DIM)).float()
    rope = torch.arange(ref.HEAD_DIM) >= ref.NOPE
    lim = _ulp(q_ref) + torch.where(rope, 2 * (_ulp(pair(v.abs())) + d), wqb_tol * absdot.reshape(q.shape).float())
    err = (q - q_ref).abs()
    expect((err <= lim).all(), f"q: {(err > lim).sum().item()} values out of tolerance, worst {(err / lim).max().item():.3g}x")
    stats["q_err_of_limit_max"] = (err / lim).max().item()
    stats["q_exact_frac"] = (q == q_ref).float().mean().item()
    stats["q_ulp_max"] = bf16_ulp_diff(q, q_ref).max().item()
    stats["partials_tag"] = tag
    assert not fails, f"[{ir.build.label()}] " + "; ".join(fails)
    return stats


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """bf16 ulp of |x| (f32), the smallest normal's below 2^-126."""
    return torch.ldexp(torch.ones_like(x), torch.frexp(x.abs().clamp(min=2.0**-126))[1] - 8)


# ---- compiling the GPU test's builds ahead, in parallel (nvrtc needs no GPU) -------------


def precompile(builds: list[dict], workers: int | None = None) -> None:
    """Every build of ``builds`` (``codegen.load``'s keywords for this spec)
    compiled into the disk cache (``$MONO_CACHE_DIR``) by a pool of processes,
    so that the first launches only load."""
    codegen.precompile([dict(name="deepseek_v41/attn_front", target="sm90", **b) for b in builds], workers)
