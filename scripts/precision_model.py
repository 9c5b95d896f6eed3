"""On the CPU: what MiniMax's qkv GEMV would write on Hopper's native fp8 wgmma, against the
contract's ~1 bf16 ulp (CONTRACTS C.1; the tests allow 2 ulps, 99.9 % within 1).

The wgmma sums a 32-value block's products keeping about 13 bits: up to 2^-12.8 of the block's
sum |w x| off (scripts/probe_wgmma_fp8.py, H200). A GEMV on it would add each block's sum into f32
(as DeepSeek's wgmma loop does), so each block contributes an error of at most that bound. This
model draws every block's error uniformly within +-scale x that bound, sums in f64, rounds the
total to f32 and writes ``bf16((tot * x_scale) * s_qkv)`` as the kernel does; then counts the
bf16 ulps to the exact GEMV (codegen.reference.minimax_m3.qkv_gemv) on the tests' random inputs.

The scale is calibrated on what the H200 measured for DeepSeek's wgmma wqkv partials (GPU tests,
deepseek_front_stats.json: the largest error of a 1280-value partial, 40 blocks, of its sum |w x|:
1.33e-5 at S = 1, 1792 values): the model's same statistic is printed beside each scale.

    PYTHONPATH=. python3 scripts/precision_model.py [--tokens 16] [--seeds 3]

Prints, per scale: the modelled DeepSeek statistic, then MiniMax's share of values within 0 / 1
ulp and the largest distance (large where cancellation leaves a value far below its sum |w x|)."""

from __future__ import annotations

import argparse

import torch

from codegen.reference import minimax_m3 as ref
from codegen.targets import get_target

PROBE_BOUND = 2.0 ** -12.8  # of a block's sum |w x|: the largest wgmma fp8 block-sum error seen
BLOCK = 32
MEASURED_PARTIAL = 1.33e-5  # H200, DeepSeek wqkv partials on wgmma, S = 1: max error / sum |w x|


def block_errors(sums: torch.Tensor, absdot: torch.Tensor, scale: float, g: torch.Generator) -> torch.Tensor:
    """Every block sum's error: uniform in +-scale x the probe's bound of its sum |w x|."""
    return (torch.rand(sums.shape, generator=g, dtype=torch.float64) * 2 - 1) * scale * PROBE_BOUND * absdot


def deepseek_partial_err(scale: float, fp8, g: torch.Generator) -> float:
    """The model's largest error of a DeepSeek wqkv partial (1792 rows x 1280 values, S = 1), of its
    sum |w x|: what the H200 measured as MEASURED_PARTIAL."""
    x = (torch.randn(1, 1280, generator=g) * 1.5).clamp(-448, 448).to(fp8).double()
    w = (torch.randn(1792, 1280, generator=g) * 1.5).clamp(-448, 448).to(fp8).double()
    prod = x.view(1, 1, -1, BLOCK) * w.view(1, 1792, -1, BLOCK)
    sums, absdot = prod.sum(-1), prod.abs().sum(-1)
    return float((block_errors(sums, absdot, scale, g).sum(-1).abs() / absdot.sum(-1)).max())


def modelled_qkv(x8, x_scale, w, s_qkv, scale: float, g: torch.Generator) -> torch.Tensor:
    """qkv as a wgmma GEMV would write it under the model (block errors uniform in +-scale x bound)."""
    s, k = x8.shape
    xb = x8.double().view(s, 1, k // BLOCK, BLOCK)
    wb = w.double().view(1, -1, k // BLOCK, BLOCK)
    prod = xb * wb  # [S, N, blocks, 32]: exact in f64 (e4m3 products)
    sums, absdot = prod.sum(-1), prod.abs().sum(-1)
    tot = (sums + block_errors(sums, absdot, scale, g)).sum(-1).float()
    return ref.bf16_rn((tot * x_scale.float()[:, None]) * s_qkv.float()[None, :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=2560, help="qkv rows (the TP4 rank's 2560)")
    args = ap.parse_args()
    t = get_target("sm90")
    fp8 = getattr(torch, t.torch_fp8_dtype_name)
    print(f"MiniMax qkv: S = {args.tokens}, {args.rows} rows, K = {ref.HIDDEN}, {args.seeds} seeds; block error "
          f"bound 2^-12.8 of sum |w x| (probe); DeepSeek partial statistic measured {MEASURED_PARTIAL:.3g}")
    print("scale  DeepSeek partial  exact   within 1 ulp  max ulps")
    for scale in (1.0, 0.5, 0.3, 0.25):
        n = same = near = 0
        worst = 0
        for seed in range(args.seeds):
            g = torch.Generator().manual_seed(seed)
            ar = (torch.randn(args.tokens, ref.HIDDEN, generator=g) * 0.7).bfloat16()
            res = (torch.randn(args.tokens, ref.HIDDEN, generator=g) * 1.3).bfloat16()
            g_in = (torch.randn(ref.HIDDEN, generator=g) * 0.1).bfloat16()
            w = (torch.randn(args.rows, ref.HIDDEN, generator=g) * 0.3).clamp(-t.fp8_max, t.fp8_max).to(fp8)
            s_qkv = torch.rand(args.rows, generator=g) * 0.02 + 0.005
            nq = ref.norm_quant(ar, res, g_in, 1e-6, t)
            exact = ref.qkv_gemv(nq["x8"], nq["x_scale"], w, s_qkv)
            got = modelled_qkv(nq["x8"], nq["x_scale"], w, s_qkv, scale, g)
            d = ref.bf16_ulp_diff(got, exact)
            n, same, near = n + d.numel(), same + int((d == 0).sum()), near + int((d <= 1).sum())
            worst = max(worst, int(d.max()))
        ds = deepseek_partial_err(scale, fp8, torch.Generator().manual_seed(99))
        print(f"{scale:5.2f}  {ds:16.3g}  {same / n:6.2%}  {near / n:12.3%}  {worst:8d}")


if __name__ == "__main__":
    main()
