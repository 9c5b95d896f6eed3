"""The DeepSeek-V4.1 ``attn_front`` benchmark case (TP4 by default: 16 local
heads, compress ratio 1): inputs, the three contenders (our kernel, the
unfused chain eager, the unfused chain compiled), the correctness guard run
before any timing, and the bytes that must be read.

Inputs and launch arguments come from ``tests/deepseek_case.py`` (the GPU
tests' cases: every token live, realistic positions, key-table inputs, a
canary-filled SWA cache). The weights and their E8M0 codes (wqkv, wqkv_s, wqb,
wqb_s) come in ``copies`` copies (together > 2x the L2), one call per copy, so
every timed call streams its weights from HBM; ours gets the MX-preshuffled
copies (and ``layer = copy``), the unfused chain the logical ones. Activations
and the small inputs are shared (hot, as in a decode step)."""

from __future__ import annotations

import time

import torch

import codegen
from bench.case import BenchCase, Checks
from codegen.fp import fp8_dtype
from codegen.reference import deepseek_v41 as ref
from codegen.reference.deepseek_v41_unfused import attn_front_unfused, compare_q, compare_qkv, compare_with_reference
from codegen.stages.mxfp8_quant import mx_fp8_max
from codegen.targets import get_target
from tests import deepseek_case as dc

KERNEL = "deepseek_v41/attn_front"
TOKENS = (1, 6, 16, 48)
TP = 4
RATIO = 1
REL_ACC_GPU = 2.0**-12  # accumulation-order allowance of the GPU GEMMs (of absdot)
WEIGHTS = ("wqkv", "wqkv_s", "wqb", "wqb_s")
CHAIN_INPUTS = ("x", "qn_w", "kvn_w", "cos_sin", "pos", "slot", "swa_idx", "swa_lens", "topk", "t2r", "comp_bt")
OUTPUTS = ("q", "kt", "klen", "swa")


def weight_copies(first: dict, copies: int) -> list[dict]:
    """``first`` and ``copies - 1`` clones of its tensors: the rotation that keeps the weights cold."""
    return [first] + [{k: v.clone() for k, v in first.items()} for _ in range(copies - 1)]


def per_copy_bytes(tp: int = TP) -> int:
    """Weight bytes of one copy (wqkv + wqb and their codes)."""
    b = attn_front_bytes(1, ref.local_heads(tp))
    return b["weight"] + b["weight_scales"]


def attn_front_bytes(tokens: int, heads: int = 16, reqs: int | None = None, cols: int = 16) -> dict:
    """Bytes of one attn_front call of ``tokens`` rows. ``read`` (the floor's
    numerator): the fp8 weights wqkv [1792, 5120] and wq_b [heads * 512, 1280],
    their E8M0 codes (one byte per 32 x 32 block), x (bf16), the norm weights,
    the cos/sin rows of the tokens' positions, pos and slot, and the key
    table's inputs (swa_idx, swa_lens, topk, t2r, the block table of ``reqs``
    x ``cols`` int32; reqs as tests/deepseek_case.make_case). ``written``
    (not in the floor): q (bf16), the 584-byte records, KT and KLEN."""
    s = tokens
    reqs = max(1, (s + 2) // 3) if reqs is None else reqs
    b = {
        "wqkv": ref.QKV_ROWS * ref.HIDDEN,
        "wqb": heads * ref.HEAD_DIM * ref.Q_RANK,
        "wqkv_s": (ref.QKV_ROWS // 32) * (ref.HIDDEN // 32),
        "wqb_s": (heads * ref.HEAD_DIM // 32) * (ref.Q_RANK // 32),
        "x": s * ref.HIDDEN * 2,
        "norm_w": (ref.Q_RANK + ref.KV_DIM) * 2,
        "cos_sin": s * ref.ROPE_DIM * 4,
        "pos_slot": 2 * s * 8,
        "key_inputs": s * ref.WINDOW * 4 + s * 4 + s * ref.TOPK * 4 + s * 4 + reqs * cols * 4,
        "q": s * heads * ref.HEAD_DIM * 2,
        "records": s * (ref.RECORD_DATA + ref.RECORD_SCALE),
        "key_table": s * ref.KEYS * 4 + 2 * s * 4,
    }
    b["weight"] = b["wqkv"] + b["wqb"]
    b["weight_scales"] = b["wqkv_s"] + b["wqb_s"]
    b["activations"] = b["x"] + b["norm_w"] + b["cos_sin"] + b["pos_slot"] + b["key_inputs"]
    b["read"] = b["weight"] + b["weight_scales"] + b["activations"]
    b["written"] = b["q"] + b["records"] + b["key_table"]
    b["total"] = b["read"] + b["written"]
    b["floor"] = b["read"]
    return b


def check_abi(kernel, args: dict) -> None:
    """The launcher's argument checks that do not need a GPU (names, types,
    dtypes, shapes, runtime dimensions, contiguity, scalar ranges): what
    ``kernel.pack`` checks before it looks at the device."""
    names = [a.name for a in kernel.ir.abi]
    unknown = sorted(set(args) - set(names))
    missing = [n for n in names if n not in args and not kernel.ir.arg(n).optional]
    if unknown or missing:
        raise ValueError(f"{kernel.ir.kernel}: unknown argument(s) {unknown}, missing {missing}")
    dims: dict = {}
    for a in kernel.ir.abi:
        kernel._check(a, args.get(a.name), dims)


class AttnFrontCase(BenchCase):
    """One S of the DeepSeek-V4.1 attn_front benchmark (same interface as
    ``bench.minimax.PreAttnCase``).

    ``compiled``: the ``torch.compile`` of :func:`attn_front_unfused` shared by
    all cases (None: no compile contender). ``dry_run``: CPU tensors; the
    kernel is built (lowered, rendered, arguments checked) but not launched:
    a stand-in writes what ``tests/deepseek_case.simulate`` computes (the
    reference in the kernel's summation order) where the kernel writes, with
    this launch's tags, so that the guard and the mailbox reads run."""

    name = KERNEL
    RELEASE = ("w_ours", "w_chain", "chain_in", "swa_chain", "ws", "base_args", "case", "_standin_out")

    def __init__(self, tokens: int, context: int | None = None, *, copies: int, compiled=None, seed: int = 0,
                 dry_run: bool = False, target: str | None = None, tp: int = TP, ratio: int = RATIO,
                 tune: dict | None = None, pdl: bool = True, cooperative: bool = True, log=print):
        self.tokens = tokens
        self.context = context
        self.copies = copies
        self.compiled = compiled
        self.unfused = attn_front_unfused
        self.seed = seed
        self.tp = tp
        self.ratio = ratio
        self.heads = ref.local_heads(tp)
        self.dry_run = dry_run
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.log = log
        self.kernel = codegen.load(KERNEL, tokens=tokens, tp=tp, ratio=ratio,
                                   target=target or ("sm90" if dry_run else None), tune=tune, pdl=pdl,
                                   cooperative=cooperative)
        self.ir = self.kernel.ir
        self.target = get_target(self.ir.target.name)
        self.fp8 = fp8_dtype(self.target)
        self.fp8_max = float(mx_fp8_max(self.target))
        self.gemm = "dequant-bf16"
        self.notes: list[str] = []
        if context is not None:
            self.notes.append(f"{KERNEL}: no context-dependent stage, context {context} ignored")
        if self.device.type == "cuda" and torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction:
            # split-K partial sums of the chain's bf16 GEMMs in f32, as an MXFP8 GEMM keeps them
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
            self.notes.append("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction set to False "
                              "(the unfused GEMMs accumulate in f32)")
        self._setup()

    # -- setup

    def _setup(self) -> None:
        dev = self.device
        self.case = dc.make_case(self.tokens, self.tp, self.ratio, self.target.name,
                                 seed=2000 + 17 * self.tokens + self.seed)
        c = self.case
        self.ws = self.kernel.workspace(dev)
        self.base_args = dc.launch_args(c, self.ws, device=str(dev))
        first = {k: self.base_args[k] for k in WEIGHTS}
        self.w_ours = weight_copies(first, self.copies)
        self.w_chain = weight_copies({k: c.logical[k].to(dev) for k in WEIGHTS}, self.copies)
        self.chain_in = {k: c.inputs[k].to(dev) for k in CHAIN_INPUTS}
        self.swa0 = c.inputs["swa"]  # the canaries (CPU)
        self.swa_chain = self.swa0.to(dev).clone()
        self._standin_out = None
        if self.dry_run:
            check_abi(self.kernel, self._args(self.copies - 1))

    def _args(self, i: int) -> dict:
        return dict(self.base_args, **self.w_ours[i], layer=i % 128)

    def bytes(self) -> dict:
        bt = self.case.inputs["comp_bt"]
        return attn_front_bytes(self.tokens, self.heads, reqs=bt.shape[0], cols=bt.shape[1])

    # -- contenders

    def _ours(self, i: int) -> None:
        if not self.dry_run:
            self.kernel(**self._args(i))
            return
        self._standin(i)

    def _standin(self, i: int) -> None:
        """Dry run: the simulated kernel outputs (computed once), copied where
        the kernel writes them, every mailbox tag (QX8's too, where it is tagged
        pairs) set to this launch's (2 epoch + 1), then the counter advanced as
        the kernel advances it."""
        args = self._args(i)
        epoch = self.ir.epoch(self.ws["epoch"])
        if self._standin_out is None:
            tmp = dict(args, scratch=torch.zeros_like(self.ws["scratch"]), epoch=torch.zeros_like(self.ws["epoch"]),
                       swa=self.swa0.clone(), **{k: args[k].clone() for k in ("q", "kt", "klen")})
            dc.simulate(self.case, self.ir, tmp)
            self._standin_out = {k: tmp[k] for k in ("scratch",) + OUTPUTS}
        want = self._standin_out
        for k in OUTPUTS:
            args[k].copy_(want[k])
        scratch = self.ws["scratch"]
        scratch.copy_(want["scratch"])
        tag = 2 * epoch + 1
        for region in ("qkvp", "xrdy", "qrdy") + (("qx8", "qx8s") if dc.tagged_qx8(self.ir) else ()):
            r = self.ir.region(region)
            scratch[r.offset: r.offset + r.nbytes].view(torch.int32).view(-1, 2)[:, 1] = tag
        self.ir.advance(self.ws["epoch"])

    def _unfused(self, fn, i: int) -> dict:
        w, a = self.w_chain[i], self.chain_in
        return fn(a["x"], w["wqkv"], w["wqkv_s"], a["qn_w"], a["kvn_w"], w["wqb"], w["wqb_s"], a["cos_sin"], a["pos"],
                  a["slot"], self.swa_chain, a["swa_idx"], a["swa_lens"], a["topk"], a["t2r"], a["comp_bt"],
                  swa_block=self.case.swa_block, swa_stride=self.case.swa_stride, comp_block=self.case.comp_block,
                  ratio=self.ratio, heads=self.heads, fp8_dtype=self.fp8, fp8_max=self.fp8_max)

    def warm_up(self) -> dict:
        """Compile our kernel (JIT, disk cache), run the eager chain once and
        compile the chain for this S; seconds each. A compile failure drops
        the compile contender (noted)."""
        out = {"gemm": self.gemm}
        self._compile_ours(out)
        t0 = time.perf_counter()
        self._unfused(self.unfused, 0)
        self._sync()
        out["eager_first_s"] = time.perf_counter() - t0
        self._compile_chain(out)
        return out

    # -- the guard

    def guard(self) -> dict:
        """Run each contender once and check (bench/NOTES.md): ours with every
        check of the GPU tests (``tests/deepseek_case.check``: KT / KLEN, X8,
        QX8 and the whole SWA cache exact, the wqkv partials and q within their
        bounds, every mailbox tag of this launch); each unfused chain against
        the reference given its own intermediates (``compare_with_reference``:
        MXFP8, records, cache and key table exact; GEMMs and norms within their
        bounds; RoPE exact in eager, <= 1 bf16 ulp compiled); and each chain
        against ours: qkv (same X8) within 2 ulps + both accumulation bounds,
        q within 2 ulps + accumulation + the exact effect of QX8 values that
        differ, >= 99 % within 2 ulps. GuardError on any failure."""
        s, c = self.tokens, self.case
        check = Checks()

        args = self._args(0)
        args["swa"].copy_(self.swa0.to(self.device))
        args["q"].view(torch.int16).fill_(dc.POISON_BF16)
        args["kt"].fill_(dc.POISON_I32)
        args["klen"].fill_(dc.POISON_I32)
        epoch = self.ir.epoch(self.ws["epoch"])
        self._ours(0)
        self._sync()
        try:
            check("ours.contract", True, dc.check(c, self.ir, args, epoch=epoch))
        except AssertionError as e:
            check("ours.contract", False, {"error": str(e)[:2000]})
        got = dc.read_scratch(self.ir, self.ws["scratch"], s)
        ours_qkv, _, _, ours_qx8, ours_qs = dc.from_partials(got["partials"], c.inputs, self.target)
        if dc.publishes_qx8(self.ir):  # else (q_inline) QX8 is never stored: the contract's of our partials
            ours_qx8, ours_qs = got["qx8"], got["qx8s"]
        ours_q = args["q"].cpu()
        x8, sx = ref.mxfp8_quantize(c.inputs["x"], self.target)

        peers = {"eager": self.unfused}
        if self.compiled is not None:
            peers["compile"] = self.compiled
        lg = c.logical
        for name, fn in peers.items():
            self.swa_chain.copy_(self.swa0.to(self.device))
            out = self._unfused(fn, 0)
            self._sync()
            out = {k: v.cpu() for k, v in out.items()}
            r = compare_with_reference(out, self.swa_chain.cpu(), c.inputs, lg, self.target, self.heads, self.ratio,
                                       REL_ACC_GPU, exact_rope=(name == "eager"))
            for k, v in r.items():
                check(f"{name}.{k}", v["ok"], v)
            q = compare_qkv(out["qkv"], x8, sx, lg["wqkv"], lg["wqkv_s"], REL_ACC_GPU + dc.PARTIAL_TOL, want=ours_qkv,
                            ulps=2)
            check(f"{name}.qkv_vs_ours", q["ok"], q)
            q = compare_q(out["q"], out["qx8"], out["q_codes"], ours_q, ours_qx8, ours_qs, lg["wqb"], lg["wqb_s"],
                          REL_ACC_GPU)
            # within the bound everywhere (flips included); within 2 ulps nearly everywhere the QX8 rows agree (a
            # code flip moves its token's every q value: with the wqkv GEMV on wgmma, 9 flips in 3 tokens at S = 3)
            same = q["frac_le2_same_rows"]
            check(f"{name}.q_vs_ours", q["ok"] and (same is None or same >= 0.99), q)
        return check.raise_failures(f"{KERNEL} S={s}")

