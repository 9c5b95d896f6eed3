"""The MiniMax-M3 ``pre_attn`` (K1) benchmark case: inputs, the three contenders
(our kernel, the unfused chain eager, the unfused chain compiled), the
correctness guard run before any timing, and the bytes that must move.

One case is one token count S (one request per row, q_len 1) and one context
length: every row sees ``context`` tokens, so each scores ``context / 128 - 1``
blocks (contract A.9; ``None``: the GPU tests' default launch, seq_lens 100,
no block scored). The contenders do the same work: our kernel, and the
unfused chain :func:`codegen.reference.minimax_m3_unfused.k1_unfused` (contract
C.1 steps 1-4: norm, FP8 GEMM, head norms + RoPE + cache inserts, indexer
block scores), each writing h_out, q_out, iq_out, the K / V cache bytes and
scales, index K and the iscore pairs. The weight, its scales and the index
cache come in ``copies`` copies (together > 2x the L2), one call per copy, so
every timed call streams its weight and the keys it scores from HBM as in a
real decode step where 60 other layers' weights and index caches have passed
through the L2 since. Activations (ar, res, g_in), the small head inputs, the
K / V caches, block table and iscore are shared by the copies."""

from __future__ import annotations


import torch

import codegen
from bench.case import BenchCase, Checks
from codegen.launch import torch_dtype
from codegen.reference import minimax_m3 as ref
from codegen.reference.minimax_m3_unfused import (compare_head_outputs, compare_heads, compare_iscore, compare_qkv,
                                                  compare_quant, k1_unfused, packed_kv, score_delta_bound)
from codegen.targets import get_target
from tests import minimax_case

KERNEL = "minimax_m3/pre_attn"
HIDDEN = ref.HIDDEN
QKV_ROWS = ref.QKV_ROWS
POISON_BF16 = -1  # 0xffff: a NaN bf16 pattern no output equals
UNFUSED_STAGES = ("norm", "qkv", "heads", "scores")  # what the unfused chain covers
REL_ACC_GPU = 2.0**-12  # accumulation-order allowance (compare_qkv) for GPU GEMMs
CHAIN_TAG = 1  # the tag word of the chain's iscore pairs (it has no epoch counter)
ISCORE_CANARY = 0x5A  # iscore bytes before each guard run: unwritten pairs must keep them
DEFAULT_SEQ = 100  # minimax_case.launch_args' seq_lens without a context


def scored_per_row(context: int | None) -> int:
    """Blocks one row of ``context`` tokens scores (A.9; init 0, local 1, top-k 16)."""
    return len(ref.scored_blocks(context if context else DEFAULT_SEQ))


def pre_attn_bytes(tokens: int, context: int | None = None, rows: int = QKV_ROWS, hidden: int = HIDDEN) -> dict:
    """Bytes that must move for one K1 call of ``tokens`` rows, each row one
    request seeing ``context`` tokens. Read: the FP8 weight, its f32 row
    scales, the norm weight g_in, ar and res; the four head-norm weights, each
    token's cos/sin row (64 bf16), position and slot (int64); the index keys
    of every scored block (128 keys x 128 B per row and block) and their
    block-table entries plus seq_lens (int32). Written: h_out (bf16), q_out
    (16 x 128 bf16) and iq_out (128 bf16), the K and V cache bytes (128 each)
    and their f32 scales, the index-K bytes (128), an iscore pair (8 B) per
    scored block. ``floor`` = read + written (the copy bandwidth counts both)."""
    nsc = scored_per_row(context)
    b = {
        "weight": rows * hidden,
        "weight_scales": rows * 4,
        "g_in": hidden * 2,
        "ar_res": 2 * tokens * hidden * 2,
        "head_in": 4 * ref.HEAD_DIM * 2 + tokens * (ref.ROTARY_DIM * 2 + 8 + 8),
        "index_keys": tokens * nsc * ref.SPARSE_BLOCK * ref.HEAD_DIM,
        "score_in": tokens * (nsc * 4 + 4),
        "h_out": tokens * hidden * 2,
        "q_out": tokens * ref.LOCAL_Q_HEADS * ref.HEAD_DIM * 2,
        "iq_out": tokens * ref.HEAD_DIM * 2,
        "kv_cache": tokens * 2 * (ref.HEAD_DIM + 4),
        "index_k": tokens * ref.HEAD_DIM,
        "iscore": tokens * nsc * 8,
    }
    b["read"] = sum(b[k] for k in ("weight", "weight_scales", "g_in", "ar_res", "head_in", "index_keys", "score_in"))
    b["written"] = sum(b[k] for k in ("h_out", "q_out", "iq_out", "kv_cache", "index_k", "iscore"))
    b["total"] = b["read"] + b["written"]
    b["floor"] = b["total"]
    b["scored_blocks"] = tokens * nsc
    return b


def context_label(context: int | None) -> str:
    return "seq 100" if context is None else (f"{context // 1024}K" if context % 1024 == 0 else str(context))


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
    """One (S, context) of the MiniMax-M3 pre_attn benchmark.

    ``compiled`` is the ``torch.compile`` of :func:`k1_unfused` shared by all
    cases (None: no compile contender). ``dry_run``: CPU tensors, the kernel
    is built (lowered, rendered, ABI-checked) but not launched; a stand-in
    writes the exact reference's values where the kernel writes them (h_out,
    the mailbox, q_out, iq_out, caches, iscore pairs), so the guard and the
    mailbox code run."""

    name = KERNEL
    RELEASE = ("w_shuffled", "w_t", "s_qkv", "icache", "icache_u8", "iscore_pairs", "ws", "base_args", "chain_args",
               "ar", "res", "g_in", "h_out", "cpu", "ic0", "kv0", "_standin_want")

    def __init__(self, tokens: int, context: int | None = None, *, copies: int, gemm: str, compiled=None,
                 seed: int = 0, dry_run: bool = False, target: str | None = None, tune: dict | None = None,
                 pdl: bool = True, cooperative: bool = True, log=print):
        self.tokens = tokens
        self.context = context
        self.copies = copies
        self.gemm = gemm
        self.pad_m = 1
        self.q_len = 1
        self.compiled = compiled
        self.unfused = k1_unfused
        self.seed = seed
        self.dry_run = dry_run
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.log = log
        self.label = f"S={tokens} ctx={context_label(context)}"
        self.kernel = codegen.load(KERNEL, tokens=tokens, target=target or ("sm90" if dry_run else None), tune=tune,
                                   pdl=pdl, cooperative=cooperative)
        self.ir = self.kernel.ir
        self.target = get_target(self.ir.target.name)
        self.fp8 = torch_dtype("fp8", self.target)
        self.fp8_max = self.target.fp8_max
        self.params = dict(self.ir.build.params)
        self.eps = float(self.params.get("eps", 1e-6))
        self.notes: list[str] = []
        extra = [s.name for s in self.ir.stages if s.name not in UNFUSED_STAGES]
        if extra:
            self.notes.append(f"ours also runs stage(s) {', '.join(extra)}, which the unfused chain does not "
                              "(not like for like)")
        if context is not None:
            self.notes.append("the index cache is copied with the weights (one per copy): the scored keys are cold "
                              "too; every row has its own pages")
        if self.params.get("index_heads", 1) != 1:
            raise ValueError("the unfused chain scores one index head: build with index_heads = 1")
        self._setup()

    # -- setup

    def _setup(self) -> None:
        """Inputs and every kernel argument from tests/minimax_case.py (the GPU
        tests' launches: realistic positions, slots, caches), every token
        writing the caches; the context's seq_lens, block table (distinct
        pages for every row) and index cache; then the weight and index-cache
        copies and the chain's arguments."""
        dev = self.device
        s = self.tokens
        self.cpu = minimax_case.make_inputs(s, self.target.name, 1000 + 17 * s + self.seed, negative_slots=False)
        c = self.cpu
        self.ws = self.kernel.workspace(dev)
        self.base_args = minimax_case.launch_args(c, self.ws, device=str(dev))
        if self.context is not None:
            cols = -(-self.context // ref.SPARSE_BLOCK)
            cc = minimax_case.context_case(s, self.q_len, [self.context], seed=self.seed + 5,
                                           num_blocks=minimax_case.NUM_BLOCKS + s * cols, distinct=True)
            self.base_args.update(seq_lens=cc["seq_lens"].to(dev), block_table=cc["block_table"].to(dev),
                                  bt_width=cc["bt_cols"], q_len=self.q_len,
                                  index_cache=cc["index_cache_bytes"].view(self.fp8).to(dev))
        a = self.base_args
        self.ar, self.res, self.g_in = (a[k] for k in ("ar", "res", "g_in"))
        self.h_out = a["h_out"]
        self.ic0 = a["index_cache"].cpu().clone()  # the caches before any run (the guard restores them)
        self.kv0 = {k: a[k].cpu().clone() for k in ("k_cache", "v_cache", "k_scale", "v_scale")}
        k, v = a["k_cache"], a["v_cache"]
        self.v_offset = None  # where the V view lies in the K view's bytes (K and V sides packed)
        if k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr():
            self.v_offset = v.storage_offset() * v.element_size() - k.storage_offset() * k.element_size()
        shuffled = a["w_qkv"]
        logical = c["w"].to(dev)
        sc = a["s_qkv"]
        n = self.copies
        self.w_shuffled = [shuffled] + [shuffled.clone() for _ in range(n - 1)]
        self.w_t = [logical.t()] + [logical.clone().t() for _ in range(n - 1)]
        self.s_qkv = [sc] + [sc.clone() for _ in range(n - 1)]
        self.icache = [a["index_cache"]] + [a["index_cache"].clone() for _ in range(n - 1)]
        self.icache_u8 = [t.view(torch.uint8) for t in self.icache]
        self.iscore_pairs = a["iscore"].view(torch.int64).view(-1, ref.ISCORE_STRIDE)
        self.chain_args = {
            **{name: a[name] for name in ("g_q", "g_k", "g_iq", "g_ik", "cos_sin", "positions", "slot_mapping",
                                          "k_scale", "v_scale", "block_table", "seq_lens")},
            # packed K / V sides: V written through the K view (no aliased inputs for torch.compile)
            "k_cache": k.view(torch.uint8), "v_cache": None if self.v_offset is not None else v.view(torch.uint8),
            "v_offset": self.v_offset or 0, "iscore": self.iscore_pairs,
            "tag": torch.full((1,), CHAIN_TAG, dtype=torch.int32, device=dev),
        }
        self._standin_want = None
        if self.dry_run:
            check_abi(self.ir, self._args(n - 1))

    def _args(self, i: int) -> dict:
        return dict(self.base_args, w_qkv=self.w_shuffled[i], s_qkv=self.s_qkv[i], index_cache=self.icache[i],
                    layer=i % 128)

    def bytes(self) -> dict:
        return pre_attn_bytes(self.tokens, self.context)

    # -- contenders

    def _ours(self, i: int) -> None:
        if not self.dry_run:
            self.kernel(**self._args(i))
            return
        # dry run: the exact reference's values, written where the kernel writes them
        want = self._standin()
        args = self._args(i)
        tag = self.ir.epoch(self.ws["step"]) * self.ir.tag_stride + (i % 128) + 1
        self.h_out.copy_(want["h_out"])
        write_mailbox(self.ir, self.ws["scratch"], self.tokens, want["qkv"], want["x8"], want["x_scale"], tag)
        args["q_out"].copy_(want["q_out"])
        args["iq_out"].copy_(want["iq_out"])
        for name in ("k_scale", "v_scale"):
            args[name].copy_(want[name])
        args["v_cache"].view(torch.uint8).copy_(want["v_cache"].view(torch.uint8))  # packed: the K view
        args["k_cache"].view(torch.uint8).copy_(want["k_cache"].view(torch.uint8))  # holds the V bytes too
        args["index_cache"].view(torch.uint8).copy_(want["index_cache"].view(torch.uint8))
        pairs = args["iscore"].view(torch.int32).view(-1, ref.ISCORE_STRIDE, 2)
        w = want["written"]
        pairs[: self.tokens, :, 0][w] = want["scores"].view(torch.int32)[w]
        pairs[: self.tokens, :, 1][w] = tag
        self.ir.advance(self.ws["step"])

    def _standin(self) -> dict:
        """The exact reference of the whole launch from the starting caches
        (computed once): A.5.1-A.5.3, the head tasks, the scores."""
        if self._standin_want is None:
            c = self.cpu
            want = ref.pre_attn_front(c["ar"], c["res"], c["g_in"], c["w"], c["s_qkv"], self.eps, self.target)
            want.update(self._ref_heads(want["qkv"]))
            scores, written, _ = self._ref_scores(want["iq_out"], want["index_cache"])
            want.update(scores=scores, written=written)
            self._standin_want = want
        return self._standin_want

    def _ref_heads(self, qkv: torch.Tensor) -> dict:
        """``ref.heads`` on ``qkv`` from the starting caches (K and V packed as
        on the device)."""
        c, kv = self.cpu, self.kv0
        p = self.params
        want = ref.heads(qkv.float().cpu(), c["g_q"], c["g_k"], c["g_iq"], c["g_ik"], c["cos_sin"], c["positions"],
                         c["slot_mapping"], kv["k_cache"], kv["v_cache"], kv["k_scale"], kv["v_scale"], self.ic0,
                         self.eps, self.target, bool(p.get("static_kv_scale", False)), int(p.get("kv_page_stride", 16)),
                         1, 0)
        return packed_kv(want, kv["v_cache"], self.v_offset)

    def _ref_scores(self, iq: torch.Tensor, index_cache: torch.Tensor):
        a, p = self.base_args, self.params
        return ref.index_scores(iq.float().cpu().reshape(self.tokens, ref.HEAD_DIM), index_cache.cpu(),
                                a["block_table"].cpu(), a["seq_lens"].cpu(), self.q_len,
                                int(p.get("init_blocks", 0)), int(p.get("local_blocks", 1)))

    def _unfused(self, fn, i: int):
        p = self.params
        return fn(self.ar, self.res, self.g_in, self.w_t[i], self.s_qkv[i], index_cache=self.icache_u8[i],
                  **self.chain_args, eps=self.eps, fp8_dtype=self.fp8, fp8_max=self.fp8_max, gemm=self.gemm,
                  pad_m=self.pad_m, q_len=self.q_len, static_kv_scale=bool(p.get("static_kv_scale", False)),
                  kv_page_stride=int(p.get("kv_page_stride", 16)), init_blocks=int(p.get("init_blocks", 0)),
                  local_blocks=int(p.get("local_blocks", 1)))

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
                self._unfused(k1_unfused, 0)
                self._sync()
                return
            except RuntimeError as e:
                if n + 1 == len(tries):
                    raise
                msg = (f"{self.label}: unfused GEMM {gemm} (pad_m {pad_m}) failed "
                       f"({str(e).splitlines()[0][:200]}); trying {tries[n + 1]}")
                self.notes.append(msg)
                self.log("NOTE: " + msg)

    def warm_up(self) -> dict:
        """Compile our kernel (JIT, disk cache) and the compiled chain for this
        case; seconds each. A compile failure drops the compile contender (noted)."""
        out = {}
        self._compile_ours(out)
        self._probe_gemm()
        out["gemm"], out["pad_m"] = self.gemm, self.pad_m
        self._compile_chain(out)
        return out

    # -- the guard

    def _reset(self) -> None:
        """The caches and iscore as before any run (copy 0's index cache)."""
        a = self.base_args
        for name in ("k_cache", "v_cache", "k_scale", "v_scale"):
            a[name].copy_(self.kv0[name].to(self.device))
        self.icache[0].copy_(self.ic0.to(self.device))
        a["iscore"].fill_(ISCORE_CANARY)

    def _state(self) -> dict:
        """The head outputs' targets after a run (CPU): caches, index cache copy 0."""
        a = self.base_args
        out = {name: a[name].cpu() for name in ("k_cache", "v_cache", "k_scale", "v_scale")}
        out["index_cache"] = self.icache[0].cpu()
        return out

    def guard(self) -> dict:
        """Run each contender once from the same starting caches and compare
        (bench/NOTES.md):

        * ours: h_out bit-exact; x8 / x_scale exact vs the contract (sm90:
          ieee rsqrt) and every mailbox tag of this launch; qkv vs the exact
          GEMV of its own x8 (compare_qkv); q_out, iq_out and every cache /
          scale / index-cache byte exact vs ``ref.heads`` of its own qkv (AMD:
          within 1 ulp / 1 FP8 code: hardware rsq); iscore: exactly the pairs
          the contract scores carry this launch's tag, every other pair
          untouched, values within 2^-16 x sum|K||q| x scale of the float64
          reference on its own iq_out and index cache.
        * eager and compile: h_out bit-exact; x8 / x_scale and qkv vs ours
          (compare_qkv: 2 bf16 ulps + accumulation allowance + the exact effect
          of FP8 flips; >= 99 % within 2 ulps); heads vs ``ref.heads`` of the
          chain's own qkv: exact in eager, compile exact or within 1 bf16 ulp /
          1 FP8 code / 2^-21 relative on scales (the ``exact`` flag says
          which); iscore vs the reference on the chain's own iq_out, as ours;
          q_out / iq_out vs ours within ``compare_head_outputs`` (2 bf16 ulps +
          the propagated qkv difference); iscore values vs ours within both
          bounds + the propagated iq difference (``score_delta_bound``).

        GuardError on any failure."""
        S, c = self.tokens, self.cpu
        check = Checks()
        exact_heads = self.target.vendor == "nvidia"  # ieee rsq: the contract's bits
        canary = torch.full((ref.ISCORE_STRIDE * 16 * 8,), ISCORE_CANARY, dtype=torch.uint8)

        # ours
        self._reset()
        step0 = self.ir.epoch(self.ws["step"])
        self.h_out.view(torch.int16).fill_(POISON_BF16)
        args = self._args(0)
        args["q_out"].view(torch.int16).fill_(POISON_BF16)
        args["iq_out"].view(torch.int16).fill_(POISON_BF16)
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
        ours = {"qkv": mb["qkv"], "q_out": args["q_out"].cpu(), "iq_out": args["iq_out"].cpu(), **self._state()}
        ours["iscore"] = args["iscore"].cpu()
        ours_scores = self._check_tail("ours", check, ours, tag, canary, exact_heads)

        # the unfused chain, eager and compiled
        peers = {"eager": k1_unfused}
        if self.compiled is not None:
            peers["compile"] = self.compiled
        for name, fn in peers.items():
            self._reset()
            out = self._unfused(fn, 0)
            self._sync()
            out = {k: v.cpu() for k, v in out.items()}
            h, qkv, x8, xs = out["h_out"], out["qkv"], out["x8"], out["x_scale"]
            check(f"{name}.h_out_exact", torch.equal(h.view(torch.int16), exact["h_out"].view(torch.int16)))
            q = compare_quant(x8, xs, mb["x8"], mb["x_scale"])
            check(f"{name}.x8_vs_ours", q["x8_max_code_distance"] <= 1 and q["x_scale_max_rel"] <= 2.0**-16
                  and q["x8_flips"] <= max(2, q["x8_values"] // 1000), q)
            r = compare_qkv(mb["qkv"], mb["x8"], mb["x_scale"], qkv, x8, xs, w32, c["s_qkv"], rel_acc=REL_ACC_GPU)
            check(f"{name}.qkv_vs_ours", r["ok"] and r["frac_le2"] >= 0.99, r)
            got = {"qkv": qkv.float(), "q_out": out["q_out"], "iq_out": out["iq_out"], **self._state(),
                   "iscore": self.base_args["iscore"].cpu()}
            scores = self._check_tail(name, check, got, CHAIN_TAG, canary, exact_heads and name == "eager")
            r = compare_head_outputs(got["q_out"], got["iq_out"], got["qkv"], ours["q_out"], ours["iq_out"],
                                     ours["qkv"], c["g_q"], c["g_iq"], self.eps)
            check(f"{name}.q_vs_ours", r["ok"], r)
            check(f"{name}.iscore_vs_ours", *self._scores_vs(scores, ours_scores, got, ours))
        return check.raise_failures(f"{KERNEL} {self.label}")

    def _check_tail(self, name: str, check: Checks, got: dict, tag: int, canary: torch.Tensor, exact: bool) -> dict:
        """The head outputs and the scores of one contender against the
        contract given its own qkv / iq_out / index cache; returns what the
        cross-check of the scores needs."""
        want = self._ref_heads(got["qkv"])
        r = compare_heads(got, want, exact=exact)
        check(f"{name}.heads_{'exact' if exact else 'close'}", r["ok"], r)
        scores, written, bound = self._ref_scores(got["iq_out"], got["index_cache"].view(self.fp8))
        r = compare_iscore(got["iscore"], canary, tag, scores, written, bound)
        check(f"{name}.iscore", r["ok"], r)
        pairs = got["iscore"].view(torch.int32).view(-1, ref.ISCORE_STRIDE, 2)[: self.tokens, :, 0]
        return {"values": pairs.view(torch.float32).clone(), "written": written, "bound": bound}

    def _scores_vs(self, a: dict, b: dict, got_a: dict, got_b: dict) -> tuple[bool, dict]:
        """Two contenders' scores (where both wrote them): within both bounds +
        the propagated difference of their index q's."""
        w = a["written"]
        if not torch.equal(w, b["written"]):
            return False, {"error": "different pairs written"}
        if not w.any():
            return True, {"written": 0}
        delta = score_delta_bound(got_a["iq_out"], got_b["iq_out"], got_a["index_cache"].view(self.fp8),
                                  self.base_args["block_table"].cpu(), self.base_args["seq_lens"].cpu(), self.q_len,
                                  int(self.params.get("init_blocks", 0)), int(self.params.get("local_blocks", 1)))
        va, vb = a["values"][w], b["values"][w]
        fin = torch.isfinite(va) & torch.isfinite(vb)
        inf_ok = torch.equal(torch.isfinite(va), torch.isfinite(vb)) and bool((va[~fin] == vb[~fin]).all())
        lim = (a["bound"] + b["bound"] + delta)[w][fin]
        err = (va[fin] - vb[fin]).abs()
        over = int((~(err <= lim)).sum().item())
        worst = float((err / lim.clamp_min(1e-30)).max().item()) if err.numel() else 0.0
        return inf_ok and over == 0, {"written": int(w.sum().item()), "n_over": over, "worst": worst,
                                      "max_abs": float(err.max().item()) if err.numel() else 0.0}
