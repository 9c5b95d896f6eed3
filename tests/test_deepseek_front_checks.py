"""The GPU test's checks (tests/deepseek_case.py) on a CPU: the reference
plays the kernel (``simulate``), so every check must pass; then single
corruptions of what the kernel writes must each be caught."""

from __future__ import annotations

import pytest
import torch

from codegen.lower import lower
from codegen.spec.load import load_spec, tune_items

from . import deepseek_case as dc

SPEC = "deepseek_v41/attn_front"


def run_case(tokens, tp=4, ratio=1, target="sm90", tune=None, **flags):
    ir = lower(load_spec(SPEC, tune_items(tune)) if tune else SPEC, target=target, tokens=tokens, tp=tp, ratio=ratio, **flags)
    case = dc.make_case(tokens, tp, ratio, target, seed=tokens * 7 + tp + ratio,
                        swa_block=64 if tokens % 2 else 128, pad_rows=(1, 4), swa_pad=64 if tokens > 4 else 0)
    ws = {"scratch": torch.zeros(ir.scratch_bytes, dtype=torch.uint8), "epoch": torch.zeros(2, dtype=torch.int32),
          "tl": None}
    args = dc.launch_args(case, ws, device="cpu")
    dc.simulate(case, ir, args)
    return ir, case, args


@pytest.mark.parametrize("tokens,tp,ratio,flags", [
    (1, 4, 1, {}), (6, 2, 2, {}), (17, 4, 0, {}), (6, 4, 1, {"index": True}), (17, 4, 2, {"tuned": True}),
    (1, 4, 2, {"index": True}), (6, 4, 1, {"tune": {"symbols.QX8_TAGGED": 1}}),
])
def test_simulated_kernel_passes(tokens, tp, ratio, flags):
    ir, case, args = run_case(tokens, tp, ratio, **flags)
    stats = dc.check(case, ir, args)
    assert stats["q_exact_frac"] > 0.99  # the kernel-order emulation of exact per-block MMAs


@pytest.fixture(scope="module")
def simulated():
    return run_case(6, 4, 1)


@pytest.mark.parametrize("corrupt", ["kt", "klen", "qx8", "qx8s", "swa_canary", "swa_record", "q", "partial", "tag"])
def test_corruptions_are_caught(simulated, corrupt):
    ir, case, args = simulated
    args = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    r = ir.region
    sc = args["scratch"]
    if corrupt == "kt":
        args["kt"][2, 5] ^= 1
    elif corrupt == "klen":
        args["klen"][7] += 1
    elif corrupt == "qx8":
        sc[r("qx8").offset + 100] ^= 1
    elif corrupt == "qx8s":
        sc[r("qx8s").offset + 4] ^= 1
    elif corrupt == "swa_canary":
        args["swa"][-1] ^= 0xFF
    elif corrupt == "swa_record":
        sl = int(case.inputs["slot"][0])
        base = (sl // case.swa_block) * case.swa_stride + (sl % case.swa_block) * 576
        args["swa"][base + 10] ^= 0x01
    elif corrupt == "q":
        args["q"][1, 3, 450] = args["q"][1, 3, 450] * 1.5 + 1
    elif corrupt == "partial":
        sc[r("qkvp").offset + 8 * 77: r("qkvp").offset + 8 * 77 + 4].view(torch.float32).mul_(1.01)
    elif corrupt == "tag":
        sc[r("qkvp").offset + 8 * 5 + 4] ^= 2
    with pytest.raises(AssertionError):
        dc.check(case, ir, args)


def check_catches_qx8(case, ir, args, corrupted: bool) -> None:
    """dc.check passes on the simulated kernel's outputs, or, ``corrupted``, fails naming QX8."""
    if not corrupted:
        dc.check(case, ir, args)
        return
    with pytest.raises(AssertionError, match="QX8"):
        dc.check(case, ir, args)


@pytest.mark.parametrize("corrupt", [None, "qx8_value", "qx8_tag", "qx8s_tag", "qrdy"])
def test_tagged_qx8_checks(corrupt):
    """QX8 as tagged pairs (symbols.QX8_TAGGED): the checks read the values from the pairs and
    want every pair's tag this launch's, so the simulated kernel passes; a flipped value byte or a
    stale tag (of QX8 or of its codes) is caught; the QRDY flags, which such a build never
    writes, are not read."""
    ir, case, args = run_case(6, 4, 1, tune={"symbols.QX8_TAGGED": 1})
    assert dc.tagged_qx8(ir) and ir.region("qx8").count == 2 * 6 * 1280 // 4
    sc, r = args["scratch"], ir.region
    if corrupt == "qx8_value":
        sc[r("qx8").offset + 8 * 333 + 1] ^= 1
    elif corrupt == "qx8_tag":
        sc[r("qx8").offset + 8 * (6 * 320 - 1) + 4] ^= 2  # the last token's last pair
    elif corrupt == "qx8s_tag":
        sc[r("qx8s").offset + 8 * 41 + 4] ^= 2
    elif corrupt == "qrdy":
        sc[r("qrdy").offset: r("qrdy").offset + r("qrdy").nbytes] = 0x5A
    check_catches_qx8(case, ir, args, corrupt not in (None, "qrdy"))


@pytest.mark.parametrize("corrupt", [None, "copy_value", "copy_code_tag"])
def test_tagged_copies_checks(corrupt):
    """Tagged QX8 in 3 copies (symbols.QX8_COPIES): the simulated kernel writes every copy and
    passes; a flipped value byte in the last copy, or a stale tag among the second copy's codes,
    is caught (wq_b's CTAs poll one copy each: every copy must be the first's)."""
    ir, case, args = run_case(6, 4, 1, tune={"symbols.QX8_TAGGED": 1, "symbols.QX8_COPIES": 3})
    assert dc.tagged_copies(ir) == 3 and ir.region("qx8").count == 3 * 2 * 6 * 1280 // 4
    assert ir.region("qx8s").count == 3 * 2 * 6 * 1280 // 32
    sc, r = args["scratch"], ir.region
    if corrupt == "copy_value":
        sc[r("qx8").offset + 8 * (2 * 6 * 320 + 77) + 2] ^= 1
    elif corrupt == "copy_code_tag":
        sc[r("qx8s").offset + 8 * (6 * 40 + 5) + 4] ^= 2
    check_catches_qx8(case, ir, args, corrupt is not None)


@pytest.mark.parametrize("corrupt", [None, "x8_byte", "x8_pad_only"])
def test_x8_image_checks(corrupt):
    """X8 stored as wqkv's LDS image (symbols.X8_IMAGE): the checks read X8 from the image's
    places, so the simulated kernel passes; a flipped byte of a token's row is caught, one in a
    pad token's place (never written, never read) is not."""
    ir, case, args = run_case(17, 4, 1, tune={"symbols.X8_IMAGE": 1})
    groups = next(s for s in ir.stages if s.name == "xq").values["image_groups"]
    off = dc.image_offsets(17, 5120, groups)
    sc, base = args["scratch"], ir.region("x8").offset
    if corrupt == "x8_byte":
        sc[base + int(off[16, 4000])] ^= 1
    elif corrupt == "x8_pad_only":
        taken = torch.zeros(groups * 8 * 5120, dtype=torch.bool)
        taken[off.reshape(-1)] = True
        sc[base + int((~taken).nonzero()[0])] ^= 1
    if corrupt == "x8_byte":
        with pytest.raises(AssertionError, match="X8 bytes"):
            dc.check(case, ir, args)
    else:
        dc.check(case, ir, args)


@pytest.mark.parametrize("corrupt", ["q", "qr_out", "partial"])
def test_q_inline_corruptions_are_caught(corrupt):
    """S = 1 TP2 index build: wq_b norms q itself (no QX8 in the scratch), and the checks still
    catch a wrong q, qr_out or partial."""
    ir, case, args = run_case(1, 2, 2, index=True)
    assert not dc.publishes_qx8(ir)
    dc.check(case, ir, args)
    if corrupt == "q":
        args["q"][0, 5, 470] = args["q"][0, 5, 470] * 1.5 + 1
    elif corrupt == "qr_out":
        args["qr_out"][0, 17] = args["qr_out"][0, 17] * 2 + 1
    else:
        sc, off = args["scratch"], ir.region("qkvp").offset
        sc[off + 8 * 33: off + 8 * 33 + 4].view(torch.float32).mul_(1.01)
    with pytest.raises(AssertionError):
        dc.check(case, ir, args)
