"""Generated kernels as PyTorch custom operators, so that a model calls them
under ``torch.compile(fullgraph=True)`` and inside CUDA graph capture.

``register(kernel)`` turns one build (a ``codegen.launch.Kernel``) into a
``torch.library.custom_op`` named ``mono::<kernel>_<build>_<target>`` (e.g.
``mono::minimax_m3_pre_attn_s4_sm90``). Its schema is the spec's ABI, in order:

* a tensor argument is ``Tensor`` (``Tensor?`` where the ABI says
  ``optional``); every tensor whose intent is ``out`` or ``inout`` is in
  ``mutates_args``, so the compiler knows what the launch writes
  (the outputs, the scratch mailboxes, the epoch counter, the stamps);
* an integer scalar is ``int``, a float scalar ``float``;
* it returns nothing: the kernel writes into the tensors it is given.

The real implementation is the launcher (``kernel(**tensors)``: every ABI
check, then a launch on the current stream, so graph capture records it); the
fake (meta) implementation does nothing, since the op allocates nothing."""

from __future__ import annotations

import inspect
import re
import threading
from typing import Any, Optional

from .launch import Kernel

NAMESPACE = "mono"

_ops: dict[str, Any] = {}
_lock = threading.Lock()


def op_name(kernel: Kernel) -> str:
    """``mono::<C name>_<build label>_<target>``: one op per build, since a
    build's constants (tokens, flags) are compiled in."""
    from .generate import build_label
    from .spec import load_spec

    ir = kernel.ir
    label = build_label(load_spec(ir.kernel), ir.build)
    return f"{NAMESPACE}::{ir.name}_{re.sub(r'[^A-Za-z0-9]+', '_', label)}_{ir.target.name}"


def signature(kernel: Kernel) -> inspect.Signature:
    """The op's Python signature (torch infers the schema from it): ABI
    order; trailing optional tensors default to None."""
    import torch

    params = []
    abi = kernel.ir.abi
    for a in abi:
        if a.is_tensor:
            annotation = Optional[torch.Tensor] if a.optional else torch.Tensor
        else:
            annotation = float if a.dtype == "f32" else int
        # no defaults: torch's ADInplaceOrView kernel indexes mutated arguments by
        # position, so every call must pass all of them (seen with torch 2.11)
        params.append(inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation))
    return inspect.Signature(params, return_annotation=None)


def mutated(kernel: Kernel) -> tuple[str, ...]:
    """The ABI tensors the launch writes: intent out or inout. Optional ones
    (the timeline) are left out: torch cannot bump the version of a None
    argument; their values are for inspection after a synchronize."""
    return tuple(a.name for a in kernel.ir.abi if a.is_tensor and a.intent in ("out", "inout") and not a.optional)


def register(kernel: Kernel):
    """The custom op of ``kernel``'s build (registered on first use; later
    calls for the same build return the same op). Call it like the kernel:
    ``op(**tensors)`` or positionally in ABI order, workspace tensors
    included (``kernel.workspace(device)``)."""
    import torch

    name = op_name(kernel)
    with _lock:
        if name in _ops:
            return _ops[name]
        sig = signature(kernel)

        def launch(*args, **kwargs) -> None:
            kernel(**sig.bind(*args, **kwargs).arguments)

        def fake(*args, **kwargs) -> None:
            return None

        launch.__signature__ = fake.__signature__ = sig
        launch.__name__ = fake.__name__ = name.split("::")[1]
        op = torch.library.custom_op(name, launch, mutates_args=mutated(kernel))
        op.register_fake(fake)
        _ops[name] = op
        return op


def load_op(name: str, tokens: int = 1, target: str | None = None, **flags):
    """``register(codegen.load(name, tokens, target, **flags))``."""
    from .launch import load

    return register(load(name, tokens=tokens, target=target, **flags))
