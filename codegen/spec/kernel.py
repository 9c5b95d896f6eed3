"""The whole kernel spec (``KernelSpec``) and the checks across its parts:
names defined once, every expression's symbols known, waits only on stages
that exist."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field, field_validator

from ..errors import SpecIssue
from ..expr import ExprError, names
from ..stages import KINDS
from .models import AbiArg, Grid, MailboxSpec, Model, Name, Param, PerTarget, ScratchRegion

# names the lowering defines for every build, usable in shapes and counts
DERIVED = {
    "BLOCKS": "CTAs of the grid for the build's target",
    "THREADS": "threads per CTA",
    "WAVE": "lanes per wave (64 on AMD, 32 on NVIDIA)",
    "SCRATCH_BYTES": "size of the scratch buffer (all regions, 256-byte aligned)",
    "TL_POINTS": "timeline points per CTA",
    "FP8_MAX": "largest finite e4m3 value of the target's FP8 flavour",
}
REQUIRED_TIMELINE_POINTS = ("start",)  # stamped by the kernel template itself (and "stages_done" where listed)

Stage = Annotated[Union[tuple(m.Model for m in KINDS.values())], Field(discriminator="kind")]


class KernelSpec(Model):
    """A fused persistent kernel: its model's symbols, build parameters, grid,
    ABI, scratch mailboxes and stages (in the order every CTA runs them)."""

    kernel: Annotated[str, Field(pattern=r"^[a-z0-9_]+/[a-z0-9_]+$")]
    doc: str
    symbols: dict[Name, Union[int, float, str, PerTarget]]
    params: dict[Name, Param]
    review_builds: list[dict[Name, Union[int, float, bool]]] = []
    grid: Grid
    timeline_points: list[Name] = Field(min_length=1)
    runtime_dims: dict[Name, str] = Field(
        {}, description="tensor dimensions known only at launch (cache pages, positions): name -> doc"
    )
    abi: list[AbiArg] = Field(min_length=1)
    mailbox: MailboxSpec
    scratch: list[ScratchRegion] = []
    stages: list[Stage] = Field(min_length=1)

    @field_validator("params")
    @classmethod
    def _tokens(cls, params):  # a field check: located at 'params', not at the top of the file
        if "tokens" not in params or params["tokens"].type != "int":
            raise ValueError("params must define 'tokens' (type int): the decode rows of a build")
        return params

    @property
    def c_name(self) -> str:
        """The kernel's C symbol: ``minimax_m3/pre_attn`` -> ``minimax_m3_pre_attn``."""
        return self.kernel.replace("/", "_")


def semantic_issues(spec: KernelSpec, file: str, pos) -> list[SpecIssue]:
    """Cross-field problems: duplicate names, unknown symbols, bad waits."""
    issues: list[SpecIssue] = []

    def issue(loc, message, hint=""):
        issues.append(SpecIssue(file, pos.line_of(loc), tuple(loc), message, hint))

    scope = set(spec.symbols) | set(spec.params) | set(DERIVED)
    for name in spec.runtime_dims:
        if name in scope:
            issue(("runtime_dims", name), f"runtime dimension {name!r} shadows a symbol or parameter", "rename it")
    for name in spec.params:
        if name.upper() in spec.symbols or name.upper() in DERIVED:  # params become upper-case C constants
            issue(("params", name), f"parameter {name!r} becomes the C constant {name.upper()}, which a symbol "
                  "already names", "rename the parameter or the symbol")
        if name in spec.symbols:
            issue(("params", name), f"{name!r} is both a symbol and a parameter", "rename one")

    def check_expr(value, loc):
        try:
            unknown = names(value) - scope
        except ExprError as e:
            issue(loc, str(e), "write an integer expression over symbols and parameters")
            return
        for n in sorted(unknown):
            issue(loc, f"unknown symbol {n!r}", f"define {n!r} under 'symbols' or 'params', or fix the spelling")

    for name, value in spec.symbols.items():
        if isinstance(value, PerTarget):
            for target, expr in value.given():
                check_expr(expr, ("symbols", name, target))
        else:
            check_expr(value, ("symbols", name))
    for i, build in enumerate(spec.review_builds):
        for key, value in build.items():
            if key not in spec.params:
                issue(("review_builds", i, key), f"unknown build parameter {key!r}",
                      f"use one of {', '.join(spec.params)}")
            elif spec.params[key].problem(value):
                p = spec.params[key]
                if p.problem(value).endswith(f"of type {p.type}"):
                    issue(("review_builds", i, key), f"{key}={value!r} is not of type {p.type}",
                          "a review build is made like any build: use a value of the parameter's type")
                else:
                    issue(("review_builds", i, key), f"{value!r} not allowed (values: {p.values})")
    for target, expr in spec.grid.blocks.given():
        check_expr(expr, ("grid", "blocks", target))

    for p in REQUIRED_TIMELINE_POINTS:
        if p not in spec.timeline_points:
            issue(("timeline_points",), f"timeline point {p!r} is missing", f"add {p!r}: the kernel stamps it itself")
    if len(set(spec.timeline_points)) != len(spec.timeline_points):
        issue(("timeline_points",), "a timeline point is listed twice", "list each point once")
    abi = {a.name: a for a in spec.abi}
    scratch_args = [a.name for a in spec.abi if a.workspace == "scratch"]
    if len(scratch_args) != 1:
        issue(("abi",), f"expected exactly one argument with 'workspace: scratch', found {len(scratch_args)}",
              "mark the u8 mailbox buffer with 'workspace: scratch'")
    counter = abi.get(spec.mailbox.counter)
    if counter is None or counter.dtype != "i32" or counter.shape != [2] or counter.intent != "inout":
        issue(("mailbox", "counter"), f"the counter must name an i32 [2] inout ABI argument, got {spec.mailbox.counter!r}",
              "declare it as {name: step, dtype: i32, shape: [2], intent: inout, workspace: step}")
    if spec.mailbox.layer is not None:
        layer = abi.get(spec.mailbox.layer)
        if layer is None or layer.dtype != "i32" or layer.shape is not None:
            issue(("mailbox", "layer"), f"'layer' must name an i32 scalar ABI argument, got {spec.mailbox.layer!r}",
                  "declare it as {name: layer, dtype: i32, range: [0, 127]}")
    check_expr(spec.mailbox.tag_stride, ("mailbox", "tag_stride"))
    seen: dict[str, int] = {}
    for i, arg in enumerate(spec.abi):
        if arg.name in seen:
            issue(("abi", i, "name"), f"ABI name {arg.name!r} used twice (also abi[{seen[arg.name]}])",
                  "give every argument its own name")
        seen[arg.name] = i
        for j, d in enumerate(arg.shape or []):
            if isinstance(d, str) and d in spec.runtime_dims:
                continue  # bound at launch from the tensor, checked across arguments
            check_expr(d, ("abi", i, "shape", j))
        for j, other in enumerate(arg.may_alias):
            if other == arg.name or other not in abi or abi[other].shape is None:
                why = "itself" if other == arg.name else ("a scalar" if other in abi else "no ABI argument")
                issue(("abi", i, "may_alias", j), f"{arg.name!r} may alias {other!r}: that is {why}",
                      "name other tensor arguments of the ABI")
    seen = {}
    for i, region in enumerate(spec.scratch):
        if region.name in seen:
            issue(("scratch", i, "name"), f"scratch region {region.name!r} defined twice", "rename one")
        seen[region.name] = i
        check_expr(region.count, ("scratch", i, "count"))

    order: dict[str, int] = {}
    for i, stage in enumerate(spec.stages):
        if stage.name in order:
            issue(("stages", i, "name"), f"stage name {stage.name!r} used twice", "rename one")
        check_expr(stage.tasks, ("stages", i, "tasks"))
        for where, place in [(("placement",), stage.placement)] + [
                (("placement_by_target", t), p) for t, p in stage.placement_by_target.items()]:
            form = "fixed" if hasattr(place, "fixed") else "round_robin"
            for key, value in getattr(place, form):
                if value is not None:
                    check_expr(value, ("stages", i) + where + (form, key))
        if stage.when is not None:
            check_expr(stage.when, ("stages", i, "when"))
        for j, dep in enumerate(stage.waits_on):
            loc = ("stages", i, "waits_on", j)
            if dep == stage.name:
                issue(loc, f"stage {stage.name!r} waits on itself: a deadlock",
                      "a stage may wait only on earlier stages")
            elif dep not in order:
                later = any(s.name == dep for s in spec.stages[i + 1:])
                issue(loc, f"stage {stage.name!r} waits on {'later' if later else 'unknown'} stage {dep!r}"
                      + (": a deadlock (CTAs run stages in order)" if later else ""),
                      "a stage may wait only on stages listed before it")
        order[stage.name] = i
    return issues
