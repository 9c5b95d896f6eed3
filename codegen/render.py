"""Rendering: ``KernelIR`` -> HIP C++ source through Jinja.

Templates only place values the lowering computed (``StrictUndefined``: a
missing value is an error, never an empty string). Output is deterministic:
the same spec, build and templates give the same bytes."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from .lower import Build, KernelIR, lower, make_build
from .stages.gemv_fp8 import part_row
from .spec import load_spec, tune_items

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(ir: KernelIR) -> str:
    """The HIP source of one build."""
    template = environment().get_template("kernel.hip.j2")
    timeline = dict(ir.build.params).get("timeline", False)
    debug = dict(ir.build.params).get("debug", False)  # mailbox waits give up (kernel.hip.j2)
    text = template.render(ir=ir, constants=ir.constants, timeline=timeline, debug=debug, part_row=part_row(ir.target))
    # one trailing newline, no trailing blanks: stable diffs
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip() + "\n"


def source(kernel: str, target: str = "sm90", tune: dict | None = None, **params) -> tuple[KernelIR, str]:
    """Lower and render spec ``kernel`` for ``target`` and build ``params``
    (``tune``: overrides of stage fields, ``{"stage.field": value}``)."""
    loaded = load_spec(kernel, tune_items(tune))
    build: Build = make_build(loaded, target, **params)
    ir = lower(loaded, build)
    return ir, render(ir)
