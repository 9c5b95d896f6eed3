"""A MiniMax pre_attn build whose index scorer reads no keys, for timing probes: its key loads
(`key_bytes`: the sm90 tensor-core dots' key_regs, the CUDA-core dots) return bits of their
address, and its cp.async key copies (`copy_key_pieces`: the tensor-core dots' LDS ring) copy
nothing, so the ring's slots keep what they held. Its scores are wrong; each tile's
conversions, MMAs, index-q reads, masks and waits stay, so the time it saves is what the keys'
arrival costs beyond the tiles' compute. The question it answers: a 4K tile takes ~0.5 us a
warp at S = 16, and neither the LDS traffic nor the instruction count explained it
(bench/NOTES.md, MiniMax sessions 29-31). The timeline script takes it as `--no-key-loads`.

    from scripts.no_key_loads import without_key_loads
    kernel = without_key_loads(codegen.load("minimax_m3/pre_attn", ...))"""

from __future__ import annotations

import re

from codegen.launch import Kernel

# the two functions' definitions in the rendered source: key_bytes on one line, copy_key_pieces
# up to its closing brace at column 0
KEY_BYTES = re.compile(r"(MONO_DEVICE u32x4 key_bytes\(const Item& it, const u8\* p\)) \{ .*? \}\n")
COPY_KEY_PIECES = re.compile(r"(MONO_DEVICE void copy_key_pieces\(u32x4\* dst, int stride, const u8\* kp\) \{\n).*?\n\}\n",
                             re.S)
KEY_BYTES_PROBE = (" {  // probe: no key load\n"
                   "    const u32 x = u32(reinterpret_cast<unsigned long long>(p)) ^ u32(it.new_keys);\n"
                   "    return u32x4{x, x >> 8, x >> 16, x >> 24};\n}\n")
COPY_KEY_PIECES_PROBE = "    // probe: no key copy\n}\n"


def without_key_loads_source(source: str) -> str:
    """``source`` with the scorer's key loads and key copies replaced (ValueError where the
    build has neither: not a MiniMax pre_attn build)."""
    out, loads = KEY_BYTES.subn(lambda m: m.group(1) + KEY_BYTES_PROBE, source)
    out, copies = COPY_KEY_PIECES.subn(lambda m: m.group(1) + COPY_KEY_PIECES_PROBE, out)
    if loads + copies == 0:
        raise ValueError("found neither key_bytes nor copy_key_pieces: not a MiniMax pre_attn build?")
    return out


def without_key_loads(kernel: Kernel) -> Kernel:
    """The same build (IR, backend, launch mode) compiled from the probe source."""
    return kernel.with_source(without_key_loads_source(kernel.source))
