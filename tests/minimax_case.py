"""Random MiniMax-M3 pre_attn launches (never zeros) and how to read the
kernel's mailboxes back, shared by the GPU tests (and the benchmark)."""

from __future__ import annotations

import hashlib

import torch

from codegen.reference import minimax_m3 as ref
from codegen.targets import get_target
from codegen.weights import preshuffle

LAYER = 5
LAYER_SLOTS = 128
POISON_BF16 = -1  # 0xffff: a NaN bf16 pattern no output can equal
CANARY = 0x5A  # cache bytes the kernel must leave alone
MAX_POS = 4096
NUM_BLOCKS = 8

# the index q's rows first (qkv.rows_first: CUDA-core dots on CTAs 0..63), up to
# INLINE_NORM_TOKENS rows; the spec's sm90 builds with one index head
ROWS_FIRST = {"qkv.rows_first": "tokens <= INLINE_NORM_TOKENS"}

# the scorer's CUDA-core dots (the spec's on every target but sm90): the tensor cores' own knobs,
# on in the spec's sm90 build (f16 dots; keys in registers above 8 rows; the items from a table and
# their starts per unrolled tile), off with them
CUDA_CORES = {"scores.mma_dots": 0, "scores.f16_dots": 0, "scores.key_regs": 0, "scores.item_table": 0,
              "scores.static_item_starts": 0, "scores.iq_own_requests": 0}


def rope_table(max_pos: int = MAX_POS, rotary: int = 64, base: float = 10000.0) -> torch.Tensor:
    """cos_sin [max_pos, 64] bf16: row p = cos(p f_i) for i < 32, then sin."""
    inv = 1.0 / base ** (torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(torch.bfloat16)


def make_inputs(tokens: int, target: str, seed: int, kv_page_stride: int = 16, negative_slots: bool = True,
                index_heads: int = 1) -> dict:
    """Host tensors of one launch (weights logical, not yet preshuffled)."""
    g = torch.Generator().manual_seed(seed)
    t = get_target(target)
    fp8 = getattr(torch, t.torch_fp8_dtype_name)
    gamma = lambda: (torch.randn(ref.HEAD_DIM, generator=g) * 0.1).bfloat16()  # noqa: E731
    rows = (ref.LOCAL_Q_HEADS + 3 + index_heads) * ref.HEAD_DIM
    slots = torch.randperm(NUM_BLOCKS * ref.SPARSE_BLOCK, generator=g)[:tokens].long()
    if negative_slots and tokens > 1:
        slots[torch.randperm(tokens, generator=g)[: max(1, tokens // 4)]] = -1
    inp = {
        "ar": (torch.randn(tokens, ref.HIDDEN, generator=g) * 0.7).bfloat16(),
        "res": (torch.randn(tokens, ref.HIDDEN, generator=g) * 1.3).bfloat16(),
        "g_in": (torch.randn(ref.HIDDEN, generator=g) * 0.1).bfloat16(),
        "w": (torch.randn(rows, ref.HIDDEN, generator=g) * 0.3).clamp(-t.fp8_max, t.fp8_max).to(fp8),
        "s_qkv": torch.rand(rows, generator=g) * 0.02 + 0.005,
        "g_q": gamma(), "g_k": gamma(), "g_iq": gamma(), "g_ik": gamma(),
        "cos_sin": rope_table(),
        "positions": torch.randint(0, MAX_POS, (tokens,), generator=g).long(),
        "slot_mapping": slots,
        "target": t, "fp8": fp8, "kv_page_stride": kv_page_stride, "index_heads": index_heads,
    }
    return inp


def caches(inp: dict, device: str, num_blocks: int = NUM_BLOCKS) -> dict:
    """K/V views, scales and index cache filled with canaries. Stride 16: K and V
    sides packed in one allocation (the V view starts 8 pages in); stride 8:
    separate allocations."""
    fp8 = inp["fp8"]
    pages = num_blocks * 16
    if inp["kv_page_stride"] == 16:
        block = torch.full((num_blocks * 32768,), CANARY, dtype=torch.uint8, device=device)
        k = block.view(pages, ref.PAGE_BYTES)
        v = block[8 * ref.PAGE_BYTES:].view(pages - 8, ref.PAGE_BYTES)
    else:
        k = torch.full((num_blocks * 8, ref.PAGE_BYTES), CANARY, dtype=torch.uint8, device=device)
        v = torch.full((num_blocks * 8, ref.PAGE_BYTES), CANARY, dtype=torch.uint8, device=device)
    return {
        "k_cache": k.view(fp8), "v_cache": v.view(fp8),
        "k_scale": torch.full((pages, 16), -7.0, device=device),
        "v_scale": torch.full((pages, 16), -7.0, device=device),
        "index_cache": torch.full((num_blocks, 128, 128), CANARY, dtype=torch.uint8, device=device).view(fp8),
    }


def launch_args(inp: dict, ws: dict, device: str = "cuda", num_blocks: int = NUM_BLOCKS) -> dict:
    """Every ABI argument of a launch; outputs poisoned."""
    s = inp["ar"].shape[0]
    poison = lambda *shape: torch.full(shape, POISON_BF16, dtype=torch.int16, device=device).view(torch.bfloat16)  # noqa: E731
    bt_cols = NUM_BLOCKS
    args = {
        "ar": inp["ar"].to(device), "res": inp["res"].to(device), "h_out": poison(s, ref.HIDDEN),
        "g_in": inp["g_in"].to(device), "w_qkv": preshuffle(inp["w"], inp["target"]).to(device),
        "s_qkv": inp["s_qkv"].to(device),
        **{k: inp[k].to(device) for k in ("g_q", "g_k", "g_iq", "g_ik", "cos_sin", "positions", "slot_mapping")},
        **caches(inp, device, num_blocks),
        "q_out": poison(s, ref.LOCAL_Q_HEADS * ref.HEAD_DIM), "iq_out": poison(s, 1, ref.HEAD_DIM),
        "block_table": torch.arange(s * bt_cols, dtype=torch.int32, device=device).view(s, bt_cols) % NUM_BLOCKS,
        "seq_lens": torch.full((s,), 100, dtype=torch.int32, device=device),
        "bt_width": bt_cols, "q_len": 1,
        "iscore": torch.zeros(16 * 8192 * 8, dtype=torch.uint8, device=device),
        "layer": LAYER, **ws,
    }
    return args


def read_mailbox(kernel, scratch: torch.Tensor, tokens: int) -> dict:
    """The kernel's qkv pairs, x8 rows and x-scale pairs, from scratch."""
    ir = kernel.ir
    raw = scratch.cpu()
    rows = ir.region("qkv").count // 16

    def region(name):
        r = ir.region(name)
        return raw[r.offset: r.offset + r.nbytes]

    qkv = region("qkv").view(torch.int32).view(-1, 2)[: tokens * rows]
    x8s = region("x8s").view(torch.int32).view(-1, 2)[:tokens]
    x8 = region("x8")[: tokens * ref.HIDDEN].view(getattr(torch, ir.target.torch_fp8_dtype_name))
    return {
        "qkv": qkv[:, 0].view(torch.float32).view(tokens, rows).clone(),
        "qkv_tag": qkv[:, 1].view(tokens, rows).clone(),
        "x_scale": x8s[:, 0].view(torch.float32).clone(),
        "x8s_tag": x8s[:, 1].clone(),
        "x8": x8.view(tokens, ref.HIDDEN).clone(),
    }


def expected_tag(step: int) -> int:
    return step * LAYER_SLOTS + LAYER + 1


def reference_heads(inp: dict, qkv: torch.Tensor, args: dict, eps: float = 1e-6, static_kv_scale: bool = False,
                    index_own: int = 0) -> dict:
    """The reference head tasks on the kernel's own qkv, starting from the
    launch's (canary-filled) caches."""
    cpu = {k: args[k].cpu() for k in ("k_cache", "v_cache", "k_scale", "v_scale", "index_cache")}
    return ref.heads(qkv, inp["g_q"], inp["g_k"], inp["g_iq"], inp["g_ik"], inp["cos_sin"], inp["positions"],
                     inp["slot_mapping"], cpu["k_cache"], cpu["v_cache"], cpu["k_scale"], cpu["v_scale"],
                     cpu["index_cache"], eps, inp["target"], static_kv_scale, inp["kv_page_stride"],
                     inp["index_heads"], index_own)


def context_case(tokens: int, q_len: int, contexts: list[int], seed: int, num_blocks: int = 1024,
                 distinct: bool = False) -> dict:
    """seq_lens, a block table (one row per token row, the request's table
    repeated) and a random index cache for requests of ``q_len`` rows whose
    last rows see ``contexts`` tokens (row i of a request sees one token less
    than row i + 1: speculative verify). ``distinct``: no page appears twice
    in the tables (every request its own keys, as in a real batch; needs
    ``num_blocks >= NUM_BLOCKS + requests * cols``); otherwise pages are drawn
    with replacement."""
    g = torch.Generator().manual_seed(seed)
    requests = tokens // q_len
    cols = max(-(-max(contexts) // ref.SPARSE_BLOCK), 1)
    seq = torch.empty(tokens, dtype=torch.int32)
    table = torch.empty(tokens, cols, dtype=torch.int32)
    if distinct:
        if num_blocks < NUM_BLOCKS + requests * cols:
            raise ValueError(f"context_case: {requests} x {cols} distinct pages need num_blocks >= "
                             f"{NUM_BLOCKS + requests * cols}, got {num_blocks}")
        pool = (torch.randperm(num_blocks - NUM_BLOCKS, generator=g)[: requests * cols] + NUM_BLOCKS).to(torch.int32)
    for r in range(requests):
        ctx = contexts[r % len(contexts)]
        # pages 0 .. NUM_BLOCKS - 1 take this launch's new keys (make_inputs' slots): a real
        # request's new keys land in its last block, which the scorers wait for; here the
        # tables avoid those pages, so no scored block holds a key written in the launch
        if distinct:
            row_table = pool[r * cols:(r + 1) * cols]
        else:
            row_table = torch.randint(NUM_BLOCKS, num_blocks, (cols,), generator=g, dtype=torch.int32)
        for i in range(q_len):
            seq[r * q_len + i] = max(ctx - (q_len - 1 - i), 1)
            table[r * q_len + i] = row_table
    cache = (torch.randn(num_blocks, 128, 128, generator=g) * 2.0).to(torch.float8_e4m3fn)
    return {"seq_lens": seq, "block_table": table, "index_cache_bytes": cache.view(torch.uint8), "bt_cols": cols}


_REFERENCE_SCORES: dict[tuple, tuple] = {}


def reference_scores(iq: torch.Tensor, index_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     q_len: int, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``ref.index_scores``, kept for inputs of the same bytes: every tune of a scorer case
    launches on the same inputs and must leave the same index q and cache, so the float64
    reference (seconds at a 1M-token context) runs once a case, not once a tune. The tensors
    returned are shared: read them, do not write them."""
    h = hashlib.blake2b(digest_size=16)
    for t in (iq, index_cache, block_table, seq_lens):
        t = t.detach().cpu().contiguous()
        h.update(repr((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(torch.uint8).numpy())
    key = (h.hexdigest(), q_len, args, tuple(sorted(kwargs.items())))
    if key not in _REFERENCE_SCORES:
        _REFERENCE_SCORES[key] = ref.index_scores(iq, index_cache, block_table, seq_lens, q_len, *args, **kwargs)
    return _REFERENCE_SCORES[key]
