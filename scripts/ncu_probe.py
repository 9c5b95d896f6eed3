"""One MiniMax pre_attn build launched as the bench launches it, for Nsight Compute to sample
(GPU): rotated weight copies (cold weights), every request its own index-cache pages (cold
keys, `timeline_probe.py --cold-keys`), LAUNCHES launches, then a sync. Writes the build's
CUBIN to OUT/<tag>.cubin, so that the sampled SASS addresses can be read against the same
binary on the CPU (scripts/ncu_stalls.py).

    ncu --clock-control none -k minimax_m3_pre_attn --launch-skip 10 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters -o OUT/s16 \\
        python3 scripts/ncu_probe.py --cold-keys 16 4096 OUT/s16 [stage.field=value ...]

scripts/ncu_run.sh (scripts/gpu_run.sh ncu) runs this for a few cases and exports what ncu measured as CSV."""

import sys
from pathlib import Path

from scripts.timeline_probe import build, setup  # (reads --cold-keys from sys.argv)
from codegen.__main__ import name_values

LAUNCHES = 14


def main() -> None:
    words = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(words) < 3:
        sys.exit("usage: python3 scripts/ncu_probe.py --cold-keys TOKENS CONTEXT OUT/TAG [stage.field=value ...]")
    tokens, context, tag = int(words[0]), int(words[1]), Path(words[2])
    tune = name_values(words[3:]) or None
    kernel = build(tokens, tune)
    tag.parent.mkdir(parents=True, exist_ok=True)
    tag.with_suffix(".cubin").write_bytes(kernel.binary())
    args, weights = setup(kernel, tokens, (context,))
    import torch

    for i in range(LAUNCHES):
        args["w_qkv"] = weights[i % len(weights)]
        kernel(**args)
    torch.cuda.synchronize()
    print(f"{tag.name}: S={tokens} context {context} {tune or ''}: {LAUNCHES} launches over "
          f"{len(weights)} weight copies")


if __name__ == "__main__":
    main()
