"""Pydantic v2 models of a kernel spec's parts: build parameters, ABI
arguments, scratch regions, grid, CTA placement and the base of every stage.

Sizes, counts and conditions are written as expressions over the spec's
symbols and build parameters (``codegen.expr``); the models check their form,
``codegen.spec.kernel`` checks that every name they use exists, and the
lowering evaluates them for one build."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..expr import ExprError, names
from ..targets import TARGETS

Expr = Union[int, str]  # an integer or an expression over symbols and parameters
Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class Model(BaseModel):
    """Strict base: unknown fields are errors (a typo is never silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_expr(value: Expr | float | bool) -> Expr | float | bool:
    if isinstance(value, str):
        try:
            names(value)
        except ExprError as e:
            raise ValueError(str(e)) from None
    return value


CheckedExpr = Annotated[Expr, Field(description="integer or expression")]


class PerTarget(Model):
    """A value that may differ per target: ``default`` plus target overrides."""

    default: Expr
    gfx942: Expr | None = None
    gfx950: Expr | None = None
    sm90: Expr | None = None

    def key_for(self, target: str) -> str:
        """The key whose value ``target`` takes: its own, else ``default`` (an error's location)."""
        return target if getattr(self, target) is not None else "default"

    def for_target(self, target: str) -> Expr:
        return getattr(self, self.key_for(target))

    def given(self) -> list[tuple[str, Expr]]:
        """The (key, value) pairs the spec sets, ``default`` first."""
        return [(k, getattr(self, k)) for k in type(self).model_fields if getattr(self, k) is not None]


def per_target(value: Expr | dict | PerTarget) -> Expr | dict | PerTarget:
    """Accept a plain value as the default for every target."""
    return value if isinstance(value, (dict, PerTarget)) else {"default": value}


class Param(Model):
    """A build parameter: the kernel is compiled for one value of each."""

    type: Literal["int", "float", "bool"]
    # values before default: default's check reads it (and is then located at 'default')
    values: list[int | float | bool] | str | None = Field(
        None, description="allowed values: a list, or 'lo..hi' for an int range"
    )
    default: int | float | bool
    doc: str = ""

    @field_validator("values")
    @classmethod
    def _range(cls, v):
        if isinstance(v, str):
            m = _RANGE.match(v)
            if not m:
                raise ValueError(f"range {v!r} must look like 'lo..hi', e.g. '1..16'")
            if int(m[1]) > int(m[2]):
                raise ValueError(f"range {v!r} is empty: lo must be <= hi")
        return v

    def allowed(self) -> list | None:
        """The allowed values as a list (None: any value of the type)."""
        return _allowed(self.values)

    def problem(self, value) -> str | None:
        """Why ``value`` is not a valid value of this parameter (None: it is)."""
        return _problem(self.type, self.values, value)

    @field_validator("default")
    @classmethod
    def _default_allowed(cls, v, info):
        if "type" not in info.data or "values" not in info.data:
            return v  # already reported at its own field
        problem = _problem(info.data["type"], info.data["values"], v)
        if problem:
            raise ValueError(f"default {problem}")
        return v


_RANGE = re.compile(r"^\s*(-?[0-9]+)\s*\.\.\s*([0-9]+)\s*$")


def _allowed(values) -> list | None:
    if isinstance(values, str):
        lo, _, hi = values.partition("..")
        return list(range(int(lo), int(hi) + 1))
    return values


def _problem(type_: str, values, v) -> str | None:
    """Why ``v`` is not a value of a parameter of ``type_`` and ``values``
    (ranges are compared, never expanded: '1..1000000000' is cheap)."""
    py = {"int": int, "float": (int, float), "bool": bool}[type_]
    if not isinstance(v, py) or (type_ != "bool" and isinstance(v, bool)):
        return f"{v!r} is not of type {type_}"
    if values is None:
        return None
    if isinstance(values, str):
        m = _RANGE.match(values)
        whole = isinstance(v, int) or v.is_integer()  # v is a number here (bool is an int)
        ok = m is not None and whole and int(m[1]) <= v <= int(m[2])
    else:
        ok = any(v == w and isinstance(v, bool) == isinstance(w, bool) for w in values)
    return None if ok else f"{v!r} is not among values {values!r}"


DType = Literal["bf16", "f32", "i32", "i64", "u8", "fp8"]


class AbiArg(Model):
    """One kernel argument: a tensor (``shape`` given) or a scalar."""

    name: Name
    dtype: DType
    shape: list[Expr] | None = Field(None, description="dimensions; omit for a scalar")
    intent: Literal["in", "out", "inout"] = "in"
    optional: bool = Field(False, description="may be None (passed as a null pointer)")
    range: tuple[int, int] | None = Field(None, description="scalar bounds, inclusive")
    workspace: Literal["scratch", "step", "timeline"] | None = Field(
        None, description="allocated by kernel.workspace(device)"
    )
    may_alias: list[Name] = Field(
        [], description="tensor arguments whose memory may overlap this one's (views of one allocation whose "
        "parts the kernel keeps apart, e.g. a packed K / V cache); a launch refuses any other overlap "
        "that involves an argument the kernel writes"
    )
    doc: str = ""

    _check_shape = field_validator("shape")(
        classmethod(lambda cls, v: [_check_expr(d) for d in v] if v else v)
    )

    @model_validator(mode="after")
    def _scalar_fields(self):
        if self.range is not None and self.shape is not None:
            raise ValueError("'range' applies to scalars only; remove it or the shape")
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError(f"range {list(self.range)} is empty: lo must be <= hi")
        if self.may_alias and self.shape is None:
            raise ValueError("'may_alias' applies to tensors only; remove it or give a shape")
        return self


class ScratchRegion(Model):
    """A mailbox region of the scratch buffer (each starts 256-byte aligned).

    ``pairs``: 8-byte (value, tag) pairs written with one store; ``words``:
    plain 32-bit words published behind a flag; ``flags``: pairs whose value is
    only a ready mark."""

    name: Name
    kind: Literal["pairs", "words", "flags"]
    count: Expr
    doc: str = ""

    _check_count = field_validator("count")(classmethod(lambda cls, v: _check_expr(v)))


class MailboxSpec(Model):
    """Where the epoch comes from and how it makes the tag of this launch's
    mailbox values: ``tag = epoch * tag_stride + layer + 1``. The counter is an
    i32 [2] ABI tensor that the kernel advances itself, so repeated launches and
    graph replays need no host action; ``advance`` says how."""

    counter: Name
    layer: Name | None = None  # i32 scalar ABI argument mixed into the tag (or none)
    tag_stride: Expr = 1
    # last_out: the counter is (epoch, CTAs done); each CTA counts itself out at its end with an
    #   atomic add whose result it waits for, and the last one out advances the epoch and resets
    #   the count: (epoch + 1, 0) after a launch.
    # count: the counter is one u64 (low word first), the CTAs finished over all launches, and the
    #   epoch is count / BLOCKS; each CTA adds itself at its end with a reduction whose result
    #   nobody waits for. A CTA reads the count at its start: after every CTA of the earlier
    #   launches added itself, before its own addition, so it sees at most BLOCKS - 1 of this
    #   launch's (BLOCKS * launches after them).
    # slots: each CTA keeps its own epoch in the scratch (region `epochs`, one 32-byte sector a
    #   CTA), reads it at its start and stores it + 1 at its end: no atomic, no line that all CTAs
    #   share, and no CTA reads another's slot. CTA 0 also stores it into the counter, (epoch + 1,
    #   0) after a launch as under last_out: the host's view, which the kernel never reads.
    # Builds that share one counter must advance it the same way, and under count have the same
    # BLOCKS: otherwise an epoch can repeat and a launch take an earlier one's mailbox values as
    # its own (under slots they share the scratch too, and so BLOCKS). Kernel.workspace gives
    # every build its own counter.
    advance: Literal["last_out", "count", "slots"] = "last_out"

    _stride = field_validator("tag_stride")(classmethod(lambda cls, v: _check_expr(v)))


class Grid(Model):
    threads: int = Field(gt=0)
    blocks: PerTarget
    # NVIDIA: the share of the SM's unified L1 / shared memory the kernel prefers as shared
    # memory, in percent (0..100: CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, set when the
    # kernel is loaded); -1 leaves it to the driver, which keeps the split the SM had if the
    # kernel's LDS fits it: the kernel's speed then depends on what ran before it (DeepSeek TP4
    # S = 16 on H200: 14.9 us after the unfused eager chain, 15.6-15.9 after its torch.compile,
    # 14.2-14.7 at 100 after either; bench/NOTES.md DeepSeek session 39). AMD: -1 only
    smem_carveout: PerTarget = PerTarget(default=-1)

    _per_target = field_validator("blocks", "smem_carveout", mode="before")(classmethod(lambda cls, v: per_target(v)))


class RoundRobin(Model):
    """Task t runs on CTA ``first + t % ctas`` (``ctas`` defaults to the rest of the grid)."""

    round_robin: "RoundRobinArgs"


class RoundRobinArgs(Model):
    first: Expr = 0
    ctas: Expr | None = None


class Fixed(Model):
    """Task t runs on CTA ``first + t``; the range holds ``count`` CTAs."""

    fixed: "FixedArgs"


class FixedArgs(Model):
    first: Expr
    count: Expr


Placement = Union[RoundRobin, Fixed]


class StageBase(Model):
    """What every stage has: a name, a task count, where its tasks run, the
    stages it waits on, and a condition for builds that include it."""

    name: Name
    kind: str
    doc: str = ""
    tasks: Expr
    when: str | None = Field(None, description="expression; the stage exists iff true")
    placement: Placement = Field(default_factory=lambda: RoundRobin(round_robin=RoundRobinArgs()))
    placement_by_target: dict[Literal["gfx942", "gfx950", "sm90"], Placement] = {}
    waits_on: list[Name] = []
    start_point: Name | None = None  # timeline point stamped as a CTA enters the stage (kinds that stamp it: STAMPED_POINTS; others refuse it)
    done_point: Name | None = None  # timeline point stamped as a CTA leaves the stage (kinds that stamp it: STAMPED_POINTS; others refuse it)

    _exprs = field_validator("tasks", "when")(classmethod(lambda cls, v: _check_expr(v)))

    def placement_for(self, target: str) -> Placement:
        return self.placement_by_target.get(target, self.placement)


KNOWN_TARGETS = tuple(TARGETS)
