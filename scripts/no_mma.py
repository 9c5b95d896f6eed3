"""A build without its fp8 MMAs, for timing probes (sm90): the bodies of the sm90 library's
emulated e4m3 `mma.sync` (`mma_fp8_16x8x32` and its `_free` twin) and of its native e4m3
`wgmma` (`wgmma_fp8_n8` / `_n16`) replaced by a LOP3 of their operands. Its results are wrong;
the weight loads, operand reads and everything else stay, so the time it saves is what the
MMAs cost (bench/NOTES.md, DeepSeek session 13: 1.3 / 2 / 5.4 us of DeepSeek S = 1 / 16 / 48).
The timeline scripts take it as `--no-mma`.

    from scripts.no_mma import without_fp8_mma
    kernel = without_fp8_mma(codegen.load(...))"""

from __future__ import annotations

import re

from codegen.launch import Kernel

# the emulated fp8 mma.sync functions' definitions in the rendered source, up to their closing
# brace at column 0; then the native wgmma ones' (sm90 builds whose spec turns wgmma on)
MMA_FUNCTIONS = re.compile(
    r"(MONO_DEVICE void (mma_fp8_16x8x32|mma_fp8_16x8x32_free)\(float \(&d\)\[4\], const u32 \(&a\)\[4\], u32 b0, u32 b1\) \{\n)"
    r".*?\n\}\n", re.S)
WGMMA_FUNCTIONS = re.compile(
    r"(MONO_DEVICE void wgmma_fp8_n(8|16)\(float \(&d\)\[(?:4|8)\], const u32x4& a, u64 desc\) \{\n)"
    r".*?\n\}\n", re.S)
PROBE_BODY = ("    const u32 x = a[0] ^ a[1] ^ a[2] ^ a[3] ^ b0 ^ b1;  // probe: no MMA\n"
              "    d[0] += __uint_as_float(x & 0x3f800000u);\n"
              "    d[1] = d[0];\n    d[2] = d[0];\n    d[3] = d[0];\n}\n")
WGMMA_PROBE_BODY = ("    const u32 x = a.x ^ a.y ^ a.z ^ a.w ^ u32(desc);  // probe: no MMA\n"
                    "    d[0] += __uint_as_float(x & 0x3f800000u);\n"
                    "    for (int i = 1; i < int(sizeof(d) / sizeof(d[0])); ++i) d[i] = d[0];\n}\n")


def without_fp8_mma_source(source: str) -> str:
    """``source`` with the fp8 MMA functions' bodies replaced: both emulated mma.sync ones
    (ValueError if either is missing) and the native wgmma ones where the build has them."""
    out, n = MMA_FUNCTIONS.subn(lambda m: m.group(1) + PROBE_BODY, source)
    if n != 2:
        raise ValueError(f"expected the sm90 library's two fp8 mma.sync functions, found {n}: not an sm90 build?")
    return WGMMA_FUNCTIONS.sub(lambda m: m.group(1) + WGMMA_PROBE_BODY, out)


def without_fp8_mma(kernel: Kernel) -> Kernel:
    """The same build (IR, backend, launch mode) compiled from the probe source."""
    return kernel.with_source(without_fp8_mma_source(kernel.source))
