"""mono-codegen: fused persistent LLM decode kernels ("mono kernels") from YAML
specs, as readable HIP C++, compiled at run time and launched on PyTorch tensors.

    spec (codegen.spec) -> IR (codegen.lower) -> HIP (codegen.render)
        -> binary (codegen.jit) -> kernel(**tensors) (codegen.launch)

``codegen.load("minimax_m3/pre_attn", tokens=4)`` is the usual entry point."""

__version__ = "0.1.0"


def load(name: str, tokens: int = 1, target: str | None = None, **flags):
    """The kernel of spec ``name`` built for ``tokens`` rows and ``flags``, for
    ``target`` (default: the current torch device's), ready to launch."""
    from .launch import load as _load

    return _load(name, tokens=tokens, target=target, **flags)


def precompile(builds, workers: int | None = None, errors: str = "raise") -> list:
    """Every build of ``builds`` (dicts of ``load``'s keywords, ``name`` among
    them) compiled into the disk cache by parallel processes; needs no GPU.
    See ``codegen.launch.precompile``."""
    from .launch import precompile as _precompile

    return _precompile(builds, workers, errors)
