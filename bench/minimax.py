"""The MiniMax-M3 ``pre_attn`` benchmark case: inputs, the three contenders
(our kernel, the unfused chain eager, the unfused chain compiled), the
correctness guard run before any timing, and the bytes that must move.

One case is one token count S and optionally one context length (for the
context-dependent stages: indexer scores; without one, the GPU tests' default
launch, where no block is scored). The weight and its scales
come in ``copies`` copies (together > 2x the L2), one call per copy, so every
timed call streams its weight from HBM as in a real decode step where 60 other
layers' weights have passed through the L2 since. Activations (ar, res, g_in)
are shared by the copies: in a decode step they are produced just before."""

from __future__ import annotations


import torch

import codegen
from bench.case import BenchCase, Checks
from codegen.launch import torch_dtype
from codegen.reference import minimax_m3 as ref
from codegen.reference.minimax_m3_unfused import compare_qkv, compare_quant, pre_attn_unfused
from codegen.targets import get_target
from tests import minimax_case

KERNEL = "minimax_m3/pre_attn"
HIDDEN = ref.HIDDEN
QKV_ROWS = ref.QKV_ROWS
POISON_BF16 = -1  # 0xffff: a NaN bf16 pattern no output equals
UNFUSED_STAGES = ("norm", "qkv")  # what the unfused chain covers
REL_ACC_GPU = 2.0**-12  # accumulation-order allowance (compare_qkv) for GPU GEMMs


def pre_attn_bytes(tokens: int, rows: int = QKV_ROWS, hidden: int = HIDDEN) -> dict:
    """Bytes that must move for one pre_attn call of ``tokens`` rows: read the
    FP8 weight, its f32 row scales, the norm weight, ar and res; write h_out
    and qkv (bf16)."""
    b = {
        "weight": rows * hidden,
        "weight_scales": rows * 4,
        "g_in": hidden * 2,
        "ar_res": 2 * tokens * hidden * 2,
        "h_out": tokens * hidden * 2,
        "qkv": tokens * rows * 2,
    }
    b["read"] = b["weight"] + b["weight_scales"] + b["g_in"] + b["ar_res"]
    b["written"] = b["h_out"] + b["qkv"]
    b["total"] = b["read"] + b["written"]
    return b


# ----------------------------------------------------------------------------- mailbox


def write_mailbox(ir, scratch: torch.Tensor, tokens: int, qkv: torch.Tensor, x8: torch.Tensor,
                  x_scale: torch.Tensor, tag: int) -> None:
    """Write what the kernel publishes (the dry run's stand-in for a launch):
    qkv pairs (f32 bits, tag), x8 rows, x-scale pairs. ``scratch`` is a CPU u8
    tensor."""
    words = scratch.view(torch.int32)
    q = ir.region("qkv")
    rows = q.count // 16  # the row stride tests/minimax_case.read_mailbox reads with
    full = torch.zeros(tokens, rows, dtype=torch.float32)
    full[:, : qkv.shape[1]] = qkv.float()
    pairs = torch.stack([full.reshape(-1).view(torch.int32),
                         torch.full((tokens * rows,), tag, dtype=torch.int32)], dim=1)
    words[q.offset // 4: q.offset // 4 + pairs.numel()] = pairs.reshape(-1)
    r = ir.region("x8")
    scratch[r.offset: r.offset + tokens * HIDDEN] = x8.contiguous().view(torch.uint8).reshape(-1)
    s = ir.region("x8s")
    sp = torch.stack([x_scale.float().reshape(-1).view(torch.int32), torch.full((tokens,), tag, dtype=torch.int32)], 1)
    words[s.offset // 4: s.offset // 4 + sp.numel()] = sp.reshape(-1)


# ----------------------------------------------------------------------------- kernel arguments


def check_abi(ir, args: dict) -> None:
    """What the launcher checks before it looks at the device (for the dry
    run, where tensors stay on the CPU): names, missing arguments, dtypes and
    the fixed dimensions of every tensor."""
    names = [a.name for a in ir.abi]
    unknown = sorted(set(args) - set(names))
    missing = [n for n in names if n not in args and not ir.arg(n).optional]
    if unknown or missing:
        raise ValueError(f"{ir.kernel}: unknown argument(s) {unknown}, missing {missing}")
    for a in ir.abi:
        v = args.get(a.name)
        if not a.is_tensor or v is None:
            continue
        want = torch_dtype(a.dtype, ir.target)
        if v.dtype != want:
            raise ValueError(f"{ir.kernel} argument {a.name!r}: dtype {v.dtype}, expected {want}")
        if v.dim() != len(a.shape) or any(isinstance(d, int) and d != n for d, n in zip(a.shape, v.shape)):
            raise ValueError(f"{ir.kernel} argument {a.name!r}: shape {list(v.shape)}, expected {list(a.shape)}")


# ----------------------------------------------------------------------------- the case


class PreAttnCase(BenchCase):
    """One S (and context) of the MiniMax-M3 pre_attn benchmark.

    ``compiled`` is the ``torch.compile`` of :func:`pre_attn_unfused` shared by
    all cases (None: no compile contender). ``dry_run``: CPU tensors, the
    kernel is built (lowered, rendered, ABI-checked) but not launched; a
    stand-in writes the exact reference's values where the kernel writes
    them, so the guard and mailbox code run."""

    name = KERNEL
    RELEASE = ("w_shuffled", "w_t", "s_qkv", "ws", "base_args", "ar", "res", "g_in", "h_out", "cpu")

    def __init__(self, tokens: int, context: int | None = None, *, copies: int, gemm: str, compiled=None,
                 seed: int = 0, dry_run: bool = False, target: str | None = None, log=print):
        self.tokens = tokens
        self.context = context
        self.copies = copies
        self.gemm = gemm
        self.pad_m = 1
        self.compiled = compiled
        self.unfused = pre_attn_unfused
        self.seed = seed
        self.dry_run = dry_run
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.log = log
        self.kernel = codegen.load(KERNEL, tokens=tokens, target=target or ("sm90" if dry_run else None))
        self.ir = self.kernel.ir
        self.target = get_target(self.ir.target.name)
        self.fp8 = torch_dtype("fp8", self.target)
        self.fp8_max = self.target.fp8_max
        self.eps = float(dict(self.ir.build.params).get("eps", 1e-6))
        self.notes: list[str] = []
        extra = [s.name for s in self.ir.stages if s.name not in UNFUSED_STAGES]
        if extra:
            self.notes.append(f"ours also runs stage(s) {', '.join(extra)}, which the unfused chain does not "
                              "(not like for like; their bytes are not in the floor)")
        self._setup()

    # -- setup

    def _setup(self) -> None:
        """Inputs and every kernel argument from tests/minimax_case.py (the GPU
        tests' launches: realistic positions, slots, caches), with every token
        writing the caches; then the weight copies."""
        dev = self.device
        self.cpu = minimax_case.make_inputs(self.tokens, self.target.name, 1000 + 17 * self.tokens + self.seed,
                                            negative_slots=False)
        c = self.cpu
        self.ws = self.kernel.workspace(dev)
        self.base_args = minimax_case.launch_args(c, self.ws, device=str(dev))
        if self.context is not None:  # the hook for context-dependent stages (indexer scores)
            cc = minimax_case.context_case(self.tokens, 1, [self.context], seed=self.seed + 5)
            self.base_args.update(seq_lens=cc["seq_lens"].to(dev), block_table=cc["block_table"].to(dev),
                                  bt_width=cc["bt_cols"], index_cache=cc["index_cache_bytes"].view(self.fp8).to(dev))
        self.ar, self.res, self.g_in = (self.base_args[k] for k in ("ar", "res", "g_in"))
        self.h_out = self.base_args["h_out"]
        shuffled = self.base_args["w_qkv"]
        logical = c["w"].to(dev)
        s = self.base_args["s_qkv"]
        self.w_shuffled = [shuffled] + [shuffled.clone() for _ in range(self.copies - 1)]
        self.w_t = [logical.t()] + [logical.clone().t() for _ in range(self.copies - 1)]
        self.s_qkv = [s] + [s.clone() for _ in range(self.copies - 1)]
        if self.dry_run:
            check_abi(self.ir, self._args(0))
            self._standin_want = None

    def _args(self, i: int) -> dict:
        return dict(self.base_args, w_qkv=self.w_shuffled[i], s_qkv=self.s_qkv[i], layer=i % 128)

    def bytes(self) -> dict:
        return pre_attn_bytes(self.tokens)

    # -- contenders

    def _ours(self, i: int) -> None:
        if not self.dry_run:
            self.kernel(**self._args(i))
            return
        # dry run: the exact reference's values, written where the kernel writes them
        if self._standin_want is None:
            c = self.cpu
            self._standin_want = ref.pre_attn_front(c["ar"], c["res"], c["g_in"], c["w"], c["s_qkv"], self.eps,
                                                    self.target)
        want = self._standin_want
        step = int(self.ws["step"][0])
        tag = step * self.ir.tag_stride + (i % 128) + 1
        self.h_out.copy_(want["h_out"])
        write_mailbox(self.ir, self.ws["scratch"], self.tokens, want["qkv"], want["x8"], want["x_scale"], tag)
        self.ws["step"][0] = step + 1

    def _unfused(self, fn, i: int):
        return fn(self.ar, self.res, self.g_in, self.w_t[i], self.s_qkv[i], self.eps, self.fp8, self.fp8_max,
                  gemm=self.gemm, pad_m=self.pad_m, return_quant=True)

    def _probe_gemm(self) -> None:
        """Run the eager chain once; should ``_scaled_mm`` refuse these shapes,
        retry with the token rows padded to 16, then with the dequantized
        GEMM (each fallback noted)."""
        tries = [(self.gemm, 1)]
        if self.gemm == "scaled_mm":
            tries += [("scaled_mm", 16), ("dequant", 1)]
        for n, (gemm, pad_m) in enumerate(tries):
            self.gemm, self.pad_m = gemm, pad_m
            try:
                self._unfused(pre_attn_unfused, 0)
                self._sync()
                return
            except RuntimeError as e:
                if n + 1 == len(tries):
                    raise
                msg = (f"S={self.tokens}: unfused GEMM {gemm} (pad_m {pad_m}) failed "
                       f"({str(e).splitlines()[0][:200]}); trying {tries[n + 1]}")
                self.notes.append(msg)
                self.log("NOTE: " + msg)

    def warm_up(self) -> dict:
        """Compile our kernel (JIT, disk cache) and the compiled chain for this
        S; seconds each. A compile failure drops the compile contender (noted)."""
        out = {}
        self._compile_ours(out)
        self._probe_gemm()
        out["gemm"], out["pad_m"] = self.gemm, self.pad_m
        self._compile_chain(out)
        return out

    # -- the guard

    def guard(self) -> dict:
        """Run each contender once and compare (see bench/NOTES.md): h_out
        bit-exact everywhere; our x8 / x_scale exact vs the contract (sm90:
        ieee rsqrt) and every mailbox tag of this launch; our qkv vs the exact
        GEMV of our own x8 (compare_qkv), and vs the eager and compiled chains
        (compare_qkv: 2 bf16 ulps + accumulation allowance + the exact effect
        of FP8 flips; >= 99 % within 2 ulps). GuardError on any failure."""
        S, c = self.tokens, self.cpu
        check = Checks()

        step0 = int(self.ws["step"][0])
        self.h_out.view(torch.int16).fill_(POISON_BF16)
        self._ours(0)
        self._sync()
        mb = minimax_case.read_mailbox(self.kernel, self.ws["scratch"], S)
        n_rows = c["w"].shape[0]  # this build's qkv rows (the mailbox stride may be larger)
        mb["qkv"], mb["qkv_tag"] = mb["qkv"][:, :n_rows], mb["qkv_tag"][:, :n_rows]
        h_ours = self.h_out.cpu()
        tag = step0 * self.ir.tag_stride + 0 + 1
        exact = ref.norm_quant(c["ar"], c["res"], c["g_in"], self.eps, self.target)

        check("ours.tags", bool((mb["qkv_tag"] == tag).all() and (mb["x8s_tag"] == tag).all()),
              {"expected": tag, "qkv_tags_wrong": int((mb["qkv_tag"] != tag).sum())})
        check("ours.h_out_exact", torch.equal(h_ours.view(torch.int16), exact["h_out"].view(torch.int16)))
        q_exact = compare_quant(mb["x8"], mb["x_scale"], exact["x8"], exact["x_scale"])
        if self.target.vendor == "nvidia":  # ieee rsqrt: the contract's bits
            check("ours.x8_exact", q_exact["x8_flips"] == 0 and q_exact["x_scale_max_rel"] == 0, q_exact)
        else:  # hardware rsq: neighbours allowed
            check("ours.x8_close", q_exact["x8_max_code_distance"] <= 1 and q_exact["x_scale_max_rel"] <= 2.0**-20,
                  q_exact)
        w32 = c["w"].float()  # once: fp8 -> f32 is slow on the CPU
        own = ref.qkv_gemv(mb["x8"], mb["x_scale"], w32, c["s_qkv"])  # f32 holds the fp8 values exactly
        r = compare_qkv(mb["qkv"], mb["x8"], mb["x_scale"], own, mb["x8"], mb["x_scale"], w32, c["s_qkv"],
                        rel_acc=REL_ACC_GPU)
        check("ours.qkv_vs_exact_gemv", r["ok"], r)

        peers = {"eager": pre_attn_unfused}
        if self.compiled is not None:
            peers["compile"] = self.compiled
        for name, fn in peers.items():
            h, qkv, x8, xs = (t.cpu() for t in self._unfused(fn, 0))
            self._sync()
            check(f"{name}.h_out_exact", torch.equal(h.view(torch.int16), exact["h_out"].view(torch.int16)))
            q = compare_quant(x8, xs, mb["x8"], mb["x_scale"])
            check(f"{name}.x8_vs_ours", q["x8_max_code_distance"] <= 1 and q["x_scale_max_rel"] <= 2.0**-16
                  and q["x8_flips"] <= max(2, q["x8_values"] // 1000), q)
            r = compare_qkv(mb["qkv"], mb["x8"], mb["x_scale"], qkv, x8, xs, w32, c["s_qkv"], rel_acc=REL_ACC_GPU)
            check(f"{name}.qkv_vs_ours", r["ok"] and r["frac_le2"] >= 0.99, r)
        return check.raise_failures(f"{KERNEL} S={S}")

