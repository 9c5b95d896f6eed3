"""Lowering: a spec and one build -> ``KernelIR``, everything the templates
need as named, checked values.

Here Python computes: symbol values, the ABI with concrete shapes, the LDS
layout (a union over stages: stages run one after another in a CTA, separated
by barriers), the scratch byte layout (256-byte aligned regions), the task
table of each stage. It refuses a build that cannot run: threads or LDS over
the target's budget, tasks placed outside the grid, overlapping fixed CTA
ranges, a wait on the same or a later stage (a deadlock: every CTA runs the
stages in order, so it could wait on work queued behind itself)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import SpecError, SpecIssue
from .expr import ExprError, evaluate
from .spec import LoadedSpec, load_spec
from .spec.kernel import DERIVED
from .spec.models import Fixed, PerTarget
from .stages import KINDS
from .targets import Target, get_target

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # int constants of the generated code
SCRATCH_ALIGN = 256  # every mailbox region starts on its own 256-byte stretch
HANG_REGION, HANG_WORDS = "hang", 8  # debug builds' scratch region: the record of a wait that gave up
# mailbox.advance slots: the scratch region of the CTAs' own epochs, CTA b's at word SLOT_WORDS * b
# (one 32-byte sector a CTA: no two CTAs store into the same sector)
EPOCHS_REGION, SLOT_WORDS = "epochs", 8
LDS_ALIGN = 16  # 16-byte LDS loads and stores
# timeline builds: LDS_TL's slots after the stamps (kernel.hip.j2 names them TL_<name>): the CTA's
# timer at its start and at its end, its cycles at the end
TL_EXTRA_SLOTS = ("T0", "T1", "C1")
MAX_LDS_ALIGN = 1024  # the dynamic LDS's declared alignment (MONO_LDS_DECL): sm90's 128-byte-swizzled wgmma operands
REGION_BYTES = {"pairs": 8, "flags": 8, "words": 4}
CTYPES = {"bf16": "bf16_t", "f32": "float", "i32": "int", "i64": "long long", "u8": "u8", "fp8": "u8"}
ELEM_BYTES = {"bf16": 2, "f32": 4, "i32": 4, "i64": 8, "u8": 1, "fp8": 1}
LDS_CTYPES = {"float": 4, "u32": 4, "int": 4, "u64": 8}
SCALAR_RANGES = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1)}  # what a scalar without a range admits


@dataclass(frozen=True)
class Build:
    """The frozen values one kernel binary is compiled for (part of the JIT key)."""

    kernel: str
    target: str
    params: tuple[tuple[str, Any], ...]

    def __getitem__(self, name: str) -> Any:
        return dict(self.params)[name]

    @property
    def tokens(self) -> int:
        return self["tokens"]

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params)

    def key(self) -> str:
        """A short stable id of the build (file names, logs)."""
        blob = json.dumps([self.kernel, self.target, self.params], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def make_build(loaded: LoadedSpec, target: str, **values) -> Build:
    """A build of ``loaded`` for ``target``: defaults filled in, every value checked."""
    get_target(target)
    spec = loaded.spec
    unknown = sorted(set(values) - set(spec.params))
    if unknown:
        raise ValueError(
            f"{spec.kernel}: unknown build parameter(s) {', '.join(unknown)}; "
            f"the spec defines {', '.join(spec.params)}"
        )
    params = []
    for name, param in spec.params.items():
        value = values.get(name, param.default)
        py = {"int": int, "float": (int, float), "bool": bool}[param.type]
        if not isinstance(value, py) or (param.type != "bool" and isinstance(value, bool)):
            raise ValueError(f"{spec.kernel}: build parameter {name}={value!r} must be of type {param.type}")
        if param.problem(value):  # the type is right: a value outside 'values'
            raise ValueError(f"{spec.kernel}: build parameter {name}={value!r} is not allowed; values: {param.values}")
        params.append((name, float(value) if param.type == "float" else value))
    return Build(spec.kernel, target, tuple(params))


@dataclass(frozen=True)
class Const:
    name: str
    value: int | float | bool
    doc: str = ""

    @property
    def c_value(self) -> str:
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        if isinstance(self.value, float):
            return f"{self.value!r}f"
        return str(self.value)

    @property
    def c_type(self) -> str:
        return {bool: "bool", float: "float"}.get(type(self.value), "int")


@dataclass(frozen=True)
class Arg:
    """One ABI argument with concrete shape for the build."""

    name: str
    dtype: str
    shape: tuple[int | str, ...] | None  # a str is a runtime dimension (bound at launch)
    intent: str
    optional: bool
    range: tuple[int, int] | None
    workspace: str | None
    doc: str
    may_alias: tuple[str, ...] = ()  # tensors whose memory may overlap this one's (the spec's, both ways)

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None

    @property
    def c_decl(self) -> str:
        ctype = CTYPES[self.dtype]
        if not self.is_tensor:
            return f"{ctype} {self.name}"
        const = "const " if self.intent == "in" else ""
        return f"{const}{ctype}* __restrict__ {self.name}"

    @property
    def shape_text(self) -> str:
        return "scalar" if self.shape is None else "[" + ", ".join(str(d) for d in self.shape) + "]"


@dataclass(frozen=True)
class Region:
    name: str
    kind: str
    count: int
    offset: int
    nbytes: int
    doc: str

    @property
    def c_type(self) -> str:
        return "u32" if self.kind == "words" else "u64"


@dataclass(frozen=True)
class LdsBuf:
    stage: str
    name: str
    ctype: str
    count: int
    offset: int
    whole_kernel: bool = False  # lds_kernel: beside the union, never reused

    @property
    def nbytes(self) -> int:
        return self.count * LDS_CTYPES[self.ctype]

    @property
    def const_name(self) -> str:
        """Its offset constant, inside the stage's namespace."""
        return f"LDS_{self.name.upper()}"

    @property
    def qualified_name(self) -> str:
        return self.const_name if self.stage == "kernel" else f"stage_{self.stage}::{self.const_name}"


@dataclass(frozen=True)
class StageIR:
    index: int
    name: str
    kind: str
    doc: str
    tasks: int
    placement: str  # "round_robin" | "fixed"
    first: int
    ctas: int
    waits_on: tuple[str, ...]
    values: dict = field(hash=False, compare=False)

    @property
    def template(self) -> str:
        return f"stages/{self.kind}.j2"


def _u64_of(lo: int, hi: int) -> int:
    """mailbox.advance count's counter: one u64 in two i32 words, low word first."""
    return (lo & 0xFFFFFFFF) | (hi & 0xFFFFFFFF) << 32


def _i32_of(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


@dataclass(frozen=True)
class KernelIR:
    spec_path: str
    kernel: str
    name: str
    doc: str
    build: Build
    target: Target
    threads: int
    blocks: int
    smem_carveout: int  # NVIDIA: preferred shared-memory percent of the L1 / shared split (-1: the driver's)
    constants: tuple[Const, ...]
    abi: tuple[Arg, ...]
    regions: tuple[Region, ...]
    scratch_bytes: int
    lds: tuple[LdsBuf, ...]
    lds_bytes: int
    stages: tuple[StageIR, ...]
    timeline_points: tuple[str, ...]
    timeline_extra: tuple[str, ...]  # LDS_TL's slots after the stamps (TL_EXTRA_SLOTS)
    scratch_arg: str  # the ABI argument holding the mailboxes
    counter_arg: str  # i32 [2]: how the kernel keeps it is epoch_advance's
    layer_arg: str | None  # i32 scalar mixed into the tag
    tag_stride: int
    timeline_arg: str | None  # i64 [BLOCKS, TL_POINTS] stamps
    tune: tuple = ()  # the spec's tuning overrides (LoadedSpec.tune)
    epoch_advance: str = "last_out"  # the spec's mailbox.advance

    @property
    def epoch_slots(self) -> Region | None:
        """Under advance slots: the scratch region of the CTAs' own epochs (one every SLOT_WORDS
        words); None otherwise."""
        return self.region(EPOCHS_REGION) if self.epoch_advance == "slots" else None

    slot_words = SLOT_WORDS

    def epoch(self, counter) -> int:
        """The epoch the next launch takes from the counter's two i32 values (a list or tensor);
        under advance slots the counter is CTA 0's copy of its slot, the host's view."""
        lo, hi = (int(v) for v in counter)
        if self.epoch_advance == "count":
            return _u64_of(lo, hi) // self.blocks
        return lo

    def advanced(self, counter, launches: int = 1) -> list[int]:
        """The counter's two i32 values after ``launches`` whole launches (last_out and slots:
        (epoch + launches, 0))."""
        lo, hi = (int(v) for v in counter)
        if self.epoch_advance == "count":
            n = (_u64_of(lo, hi) + self.blocks * launches) & 0xFFFFFFFFFFFFFFFF
            return [_i32_of(n & 0xFFFFFFFF), _i32_of(n >> 32 & 0xFFFFFFFF)]
        return [_i32_of((lo + launches) & 0xFFFFFFFF), 0]

    def advance(self, counter) -> None:
        """Advance the counter (a list or tensor) in place as one whole launch does (host stand-ins)."""
        counter[0], counter[1] = self.advanced(counter)

    @property
    def tune_label(self) -> str:
        """The tuning overrides as ``stage.field=value`` pairs (the generated header's tune line)."""
        def show(v) -> str:  # a frozen mapping ("map": (key, value) pairs) or list, at any depth
            if getattr(v, "kind", None) == "map":
                return "{" + ", ".join(f"{k}: {show(x)}" for k, x in v) + "}"
            return "[" + ", ".join(show(x) for x in v) + "]" if isinstance(v, tuple) else str(v)
        return " ".join(f"{k}={show(v)}" for k, v in self.tune)

    @property
    def waves(self) -> int:
        return self.threads // self.target.wave_size

    def arg(self, name: str) -> Arg:
        return next(a for a in self.abi if a.name == name)

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)


class _Ctx:
    """What a stage's lowering may ask for; every failure is located."""

    def __init__(self, loaded: LoadedSpec, build: Build, target: Target, scope: dict, threads: int, active: dict,
                 kernel_reserve: int = 0):
        self.loaded, self.build, self.target, self.scope = loaded, build, target, scope
        self.kernel_reserve = kernel_reserve  # kernel-lifetime LDS bytes to plan around before they are declared
        self.threads, self.tokens = threads, build.tokens
        self.active = active  # stage name -> bool
        self.lds_bufs: list[tuple[str, str, str, int]] = []
        self.lds_aligns: dict[tuple[str, str], int] = {}  # (stage, buffer): alignment above LDS_ALIGN
        self.lds_kernel_bufs: list[tuple[str, str, str, int]] = []  # lds_kernel: after the union
        self.issues: list[SpecIssue] = []
        self.loc: tuple = ()
        self.task_count = 0
        self.args: dict[str, Arg] = {}  # the lowered ABI and regions, set by the lowering
        self.regions: dict[str, Region] = {}
        self.lowered: dict[str, dict] = {}  # stage name -> its lowering's values (the stages before this one)

    def fail(self, loc: tuple, message: str, hint: str = "") -> None:
        raise _Fail(self.loaded.issue(self.loc + tuple(loc), f"[{self.build.target} {self.build.label()}] {message}", hint))

    def nvidia_only(self, loc: tuple, what: str) -> None:
        """Refuse a knob at ``loc`` on a target whose device library lacks ``what`` (NVIDIA's has it)."""
        if self.target.vendor != "nvidia":
            self.fail(loc, f"{self.target.name}'s device library has no {what}",
                      f"turn {loc[-1]} off for this target (an NVIDIA knob)")

    def evaluate(self, value, loc: tuple) -> Any:
        try:
            return evaluate(value, self.scope)
        except ExprError as e:
            self.fail(loc, str(e))

    def integer(self, value, loc: tuple, minimum: int = 1) -> int:
        """``evaluate``, refusing anything but an integer >= ``minimum`` (sizes, counts)."""
        v = self.evaluate(value, loc)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.fail(loc, f"must be an integer >= {minimum}, got {v!r}")
        return v

    def switch(self, value, loc: tuple) -> bool:
        """``evaluate``, refusing anything but a boolean or 0 / 1 (on / off knobs)."""
        v = self.evaluate(value, loc)
        if not isinstance(v, (bool, int)) or v not in (0, 1):
            self.fail(loc, f"must be true / false or 1 / 0, got {v!r}")
        return bool(v)

    def symbol(self, name: str, loc: tuple) -> Any:
        if name not in self.scope:
            self.fail(loc, f"unknown symbol {name!r}", "define it under 'symbols'")
        return self.scope[name]

    def abi_arg(self, name: str, loc: tuple, dtype: str | None = None, shape: tuple | None = None,
                written: bool = False, scalar: bool = False, within: tuple[int | None, int | None] | None = None) -> None:
        """Check that ABI argument ``name`` exists and, where given, that it has
        the dtype and the exact shape the stage indexes it with (the launcher
        checks tensors against the ABI, this checks the ABI against the kernel's
        indices: together no index runs past a tensor) and is writable. A
        ``None`` in ``shape`` takes any size (a runtime dimension: indices read
        from data). ``scalar``: a scalar argument; ``within``: its declared range
        lies in [lo, hi] (None: unbounded on that side), e.g. a divisor >= 1.

        A field the spec leaves at its default names no line of its own: a
        mismatch is then located at the ABI entry, where the defect is."""
        if not any(a.name == name for a in self.loaded.spec.abi):
            self.fail(loc, f"no ABI argument {name!r}", "add it under 'abi' or fix the name")
        arg = self.args.get(name)
        if arg is None:
            return

        def refuse(part: str, message: str, hint: str) -> None:
            if self.loc + tuple(loc) in self.loaded.positions.lines:
                self.fail(loc, message, hint)
            i = next(i for i, a in enumerate(self.loaded.spec.abi) if a.name == name)
            field = ".".join(str(p) for p in loc)
            stage = self.loaded.spec.stages[self.loc[1]].name if self.loc[:1] == ("stages",) else "?"
            raise _Fail(self.loaded.issue(("abi", i, part), f"[{self.build.target} {self.build.label()}] "
                                          f"stage {stage!r} ({field}): {message}", hint))

        if dtype is not None and arg.dtype != dtype:
            refuse("dtype", f"ABI argument {name!r} is {arg.dtype}, this stage needs {dtype}", f"declare it with dtype: {dtype}")
        if scalar and arg.is_tensor:
            refuse("shape", f"ABI argument {name!r} is a tensor {arg.shape_text}, this stage reads a scalar",
                   "declare it without a shape (a scalar, with a range)")
        if shape is not None and (not arg.is_tensor or len(arg.shape) != len(shape) or any(
                w is not None and w != g for w, g in zip(shape, arg.shape))):
            want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
            refuse("shape", f"ABI argument {name!r} has shape {arg.shape_text}, this stage indexes it as {want}",
                   "declare the shape the stage indexes: a smaller tensor would be read or written past its end")
        if written and arg.intent == "in":
            refuse("intent", f"this stage writes ABI argument {name!r}, declared intent: in", "declare it with intent: out")
        if within is not None and not arg.is_tensor:
            lo, hi = within
            have = arg.range if arg.range is not None else SCALAR_RANGES.get(arg.dtype, (None, None))
            if (lo is not None and (have[0] is None or have[0] < lo)) or (hi is not None and (have[1] is None or have[1] > hi)):
                want = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
                refuse("range", f"ABI argument {name!r} admits [{have[0]}, {have[1]}], this stage needs values in {want}",
                       f"declare range: [lo, hi] within {want}")

    def region(self, name: str, loc: tuple, kind: str, min_count: int | None = None) -> None:
        """Check that scratch region ``name`` exists, is of ``kind`` and holds at
        least ``min_count`` entries (the largest index the stage forms, plus one)."""
        region = next((r for r in self.loaded.spec.scratch if r.name == name), None)
        if region is None:
            self.fail(loc, f"no scratch region {name!r}", "add it under 'scratch' or fix the name")
        if region.kind != kind and not (kind == "pairs" and region.kind == "flags"):
            self.fail(loc, f"scratch region {name!r} is {region.kind}, this needs {kind}", f"declare it with kind: {kind}")
        lowered = self.regions.get(name)
        if min_count is not None and lowered is not None and lowered.count < min_count:
            self.fail(loc, f"scratch region {name!r} holds {lowered.count} {kind}, this stage uses {min_count}",
                      "raise the region's count")

    def stage_model(self, name: str, loc: tuple, kind: str):
        stage = next((s for s in self.loaded.spec.stages if s.name == name), None)
        if stage is None or stage.kind != kind:
            self.fail(loc, f"no {kind} stage {name!r}", f"name a stage of kind {kind}")
        return stage

    def stage_active(self, name: str) -> bool:
        return self.active.get(name, False)

    def stage_values(self, name: str) -> dict:
        """The template values of an earlier, active stage, as its own lowering computed them."""
        return self.lowered[name]

    def lds(self, stage: str, name: str, ctype: str, count: int, align: int = LDS_ALIGN) -> None:
        """An LDS buffer of the stage, at an offset that is a multiple of `align` bytes (the
        union's base, the kernel's dynamic LDS, is aligned to MAX_LDS_ALIGN)."""
        if align % LDS_ALIGN or MAX_LDS_ALIGN % align:
            raise ValueError(f"LDS buffer {stage}.{name}: alignment {align} is not a multiple of {LDS_ALIGN} dividing {MAX_LDS_ALIGN}")
        self.lds_bufs.append((stage, name, ctype, count))
        if align != LDS_ALIGN:
            self.lds_aligns[(stage, name)] = align

    def lds_kernel(self, stage: str, name: str, ctype: str, count: int) -> None:
        """An LDS buffer of the stage that lives for the whole kernel: placed after the union
        (no stage's buffers overlap it), e.g. the target of a copy issued at the kernel's start."""
        self.lds_kernel_bufs.append((stage, name, ctype, count))

    def lds_left(self, stage: str) -> int:
        """LDS bytes the target leaves for more buffers of ``stage`` after those it has
        declared (packed as the layout packs them), less the timeline stamps' and the
        kernel-lifetime buffers'."""
        return self.target.lds_bytes - _pack_lds(self.lds_bufs, self.lds_aligns)[1].get(stage, 0) - self._beside_union()

    def lds_kernel_left(self) -> int:
        """LDS bytes left for more kernel-lifetime buffers: beside the union of every stage's
        buffers declared so far (later stages must still fit), the kernel-lifetime buffers and
        the timeline stamps."""
        return self.target.lds_bytes - max(_pack_lds(self.lds_bufs, self.lds_aligns)[1].values(), default=0) - self._beside_union()

    def kernel_lds_bytes(self) -> int:
        """LDS bytes of the kernel-lifetime buffers declared so far."""
        return sum(_align(count * LDS_CTYPES[ctype], LDS_ALIGN) for _, _, ctype, count in self.lds_kernel_bufs)

    def _beside_union(self) -> int:
        """LDS bytes outside the stages' union: the kernel-lifetime buffers (at least the
        reserve, those later stages will declare) and the stamps."""
        return max(self.kernel_lds_bytes(), self.kernel_reserve) + 8 * len(self.loaded.spec.timeline_points)


def _pack_lds(bufs: list[tuple[str, str, str, int]], aligns: dict[tuple[str, str], int]) -> tuple[list[int], dict[str, int]]:
    """Each stage's LDS buffers packed from 0, 16-byte aligned (or as `aligns` says): every
    buffer's offset (in the order given) and every stage's bytes. The layout and the lowering's
    room checks share it."""
    offsets, used = [], {}
    for stage, name, ctype, count in bufs:
        offsets.append(_align(used.get(stage, 0), aligns.get((stage, name), LDS_ALIGN)))
        used[stage] = _align(offsets[-1] + count * LDS_CTYPES[ctype], LDS_ALIGN)
    return offsets, used


class _Fail(Exception):
    def __init__(self, issue: SpecIssue):
        self.issue = issue


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def lower(loaded: LoadedSpec | str, build: Build | None = None, **values) -> KernelIR:
    """The IR of ``loaded`` (a LoadedSpec or a spec name) for ``build``
    (or for a build made from ``values``: ``target=...``, parameters)."""
    if isinstance(loaded, str):
        loaded = load_spec(loaded)
    if build is None:
        values.setdefault("target", "sm90")
        build = make_build(loaded, **values)
    try:
        return _lower(loaded, build)
    except _Fail as f:
        raise SpecError([f.issue]) from None


def _lower(loaded: LoadedSpec, build: Build) -> KernelIR:
    spec, target = loaded.spec, get_target(build.target)
    ctx_issue = loaded.issue

    def fail(loc, message, hint=""):
        raise _Fail(ctx_issue(loc, f"[{build.target} {build.label()}] {message}", hint))

    def whole(value, loc, what, minimum):
        """``value`` evaluated: an integer >= ``minimum``, else a located refusal."""
        try:
            v = evaluate(value, scope)
        except ExprError as e:
            fail(loc, str(e))
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            fail(loc, f"{what} must be an integer >= {minimum}, got {v!r}")
        return v

    scope: dict[str, Any] = dict(build.params)
    threads = spec.grid.threads
    if threads % target.wave_size or threads > target.max_threads:
        fail(("grid", "threads"), f"{threads} threads: must be a multiple of {target.wave_size} and <= {target.max_threads}",
             f"use at most {target.max_threads} threads, a multiple of the wave size")
    scope.update(THREADS=threads, WAVE=target.wave_size, TL_POINTS=len(spec.timeline_points), FP8_MAX=target.fp8_max)
    for name, value in spec.symbols.items():  # in file order: later symbols may use earlier ones
        loc = ("symbols", name)
        if isinstance(value, PerTarget):  # this target's value
            loc += (value.key_for(target.name),)
            value = value.for_target(target.name)
        try:
            scope[name] = evaluate(value, scope)
        except ExprError as e:
            fail(loc, str(e), "symbols may use parameters and symbols defined above them")
        v = scope[name]
        if isinstance(v, int) and not isinstance(v, bool) and not INT_MIN <= v <= INT_MAX:
            fail(("symbols", name), f"{name} = {v} does not fit a 32-bit int (the generated constexpr int)",
                 "symbols are C int constants: keep them within +-2^31")
        if isinstance(v, float) and not math.isfinite(v):
            fail(("symbols", name), f"{name} = {v} is not a finite number")
    def grid_value(name: str):
        """grid.NAME for this target, evaluated: (its location, its value)."""
        field = getattr(spec.grid, name)
        loc = ("grid", name, field.key_for(target.name))
        try:
            return loc, evaluate(field.for_target(target.name), scope)
        except ExprError as e:
            fail(loc, str(e))

    bloc, blocks = grid_value("blocks")
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks <= 0:
        fail(bloc, f"blocks must be a positive integer, got {blocks!r}")
    scope["BLOCKS"] = blocks
    cloc, carveout = grid_value("smem_carveout")
    if isinstance(carveout, bool) or not isinstance(carveout, int) or not -1 <= carveout <= 100:
        fail(cloc, f"smem_carveout must be an integer percent 0..100 or -1 (the driver's choice), got {carveout!r}")
    if carveout >= 0 and target.vendor != "nvidia":
        fail(cloc, f"{target.name} has no L1 / shared memory carveout (smem_carveout {carveout})",
             f"leave smem_carveout at -1 for {target.name}: give the value under sm90 only")

    # scratch: regions in spec order, each 256-byte aligned
    regions, offset = [], 0
    for i, r in enumerate(spec.scratch):
        try:
            count = evaluate(r.count, scope)
        except ExprError as e:
            fail(("scratch", i, "count"), str(e))
        if not isinstance(count, int) or count <= 0:
            fail(("scratch", i, "count"), f"count must be a positive integer, got {count!r}")
        nbytes = count * REGION_BYTES[r.kind]
        regions.append(Region(r.name, r.kind, count, offset, nbytes, r.doc))
        offset = _align(offset + nbytes, SCRATCH_ALIGN)
    # the regions the lowering adds after the spec's: their names are reserved where they are added
    added = []
    if spec.mailbox.advance == "slots":  # each CTA's own epoch
        added.append((EPOCHS_REGION, blocks * SLOT_WORDS, "mailbox.advance slots' epochs",
                      f"mailbox.advance slots: CTA b's epoch at word {SLOT_WORDS} b, only CTA b reads and stores it"))
    if dict(build.params).get("debug", False):  # debug builds: where a mailbox wait gave up
        added.append((HANG_REGION, HANG_WORDS, "debug builds' hang record",
                      "debug builds: the hang record of a mailbox wait that gave up (launch.KernelHang)"))
    for name, words, owner, doc in added:
        if any(r.name == name for r in spec.scratch):
            fail(("scratch",), f"the region name {name!r} is taken by {owner}", "rename it")
        regions.append(Region(name, "words", words, offset, words * 4, doc))
        offset = _align(offset + words * 4, SCRATCH_ALIGN)
    scratch_bytes = max(offset, SCRATCH_ALIGN)
    scope["SCRATCH_BYTES"] = scratch_bytes

    abi = []
    for i, a in enumerate(spec.abi):
        shape = None
        if a.shape is not None:
            dims = []
            for j, d in enumerate(a.shape):
                if isinstance(d, str) and d in spec.runtime_dims:
                    dims.append(d)  # known at launch
                    continue
                try:
                    v = evaluate(d, scope)
                except ExprError as e:
                    fail(("abi", i, "shape", j), str(e))
                if not isinstance(v, int) or v <= 0:
                    fail(("abi", i, "shape", j), f"dimension must be a positive integer, got {v!r}")
                dims.append(v)
            shape = tuple(dims)
        aliases = tuple(sorted({*a.may_alias, *(b.name for b in spec.abi if a.name in b.may_alias)}))
        abi.append(Arg(a.name, a.dtype, shape, a.intent, a.optional, a.range, a.workspace, a.doc, aliases))
        # the workspaces the kernel template indexes itself: exactly what it forms indices into
        want = {"scratch": ("u8", (scratch_bytes,)), "step": ("i32", (2,)),
                "timeline": ("i64", (blocks, len(spec.timeline_points)))}.get(a.workspace)
        if want is not None and (a.dtype, shape) != want:
            fail(("abi", i), f"workspace {a.workspace!r} argument {a.name!r} must be {want[0]} {list(want[1])}, "
                 f"got {a.dtype} {abi[-1].shape_text}",
                 {"scratch": "shape: [SCRATCH_BYTES], dtype: u8", "step": "shape: [2], dtype: i32",
                  "timeline": "shape: [BLOCKS, TL_POINTS], dtype: i64"}[a.workspace])

    active = {}
    for i, s in enumerate(spec.stages):
        try:
            active[s.name] = bool(evaluate(s.when, scope)) if s.when is not None else True
        except ExprError as e:
            fail(("stages", i, "when"), str(e))

    def lower_stages(kernel_reserve: int):
        """Every active stage lowered, in order; each plans its LDS around kernel_reserve bytes of
        kernel-lifetime buffers (ctx.lds_left), besides those declared before it."""
        ctx = _Ctx(loaded, build, target, scope, threads, active, kernel_reserve)
        ctx.args, ctx.regions = {a.name: a for a in abi}, {r.name: r for r in regions}
        stages, fixed_ranges = [], []
        for i, s in enumerate(spec.stages):
            if not active[s.name]:
                continue
            loc = ("stages", i)
            ctx.loc = loc
            try:
                tasks = evaluate(s.tasks, scope)
            except ExprError as e:
                fail(loc + ("tasks",), str(e))
            if not isinstance(tasks, int) or tasks <= 0:
                fail(loc + ("tasks",), f"tasks must be a positive integer, got {tasks!r}")
            place = s.placement_for(target.name)
            ploc = loc + (("placement_by_target", target.name) if target.name in s.placement_by_target else ("placement",))
            if isinstance(place, Fixed):
                first = whole(place.fixed.first, ploc + ("fixed", "first"), "first", 0)
                ctas = whole(place.fixed.count, ploc + ("fixed", "count"), "count", 1)
                if tasks > ctas:
                    fail(ploc, f"{tasks} tasks do not fit the fixed range of {ctas} CTAs", "widen the range or use round_robin")
                for other, (f0, c0) in fixed_ranges:
                    if first < f0 + c0 and f0 < first + ctas:
                        fail(ploc, f"fixed CTAs {first}..{first + ctas - 1} overlap stage {other!r}'s {f0}..{f0 + c0 - 1}",
                             "give each fixed-range stage its own CTAs")
                fixed_ranges.append((s.name, (first, ctas)))
                kind = "fixed"
            else:
                rloc = ploc + ("round_robin",)
                first = whole(place.round_robin.first, rloc + ("first",), "first", 0)
                ctas = (whole(place.round_robin.ctas, rloc + ("ctas",), "ctas", 1)
                        if place.round_robin.ctas is not None else blocks - first)
                kind = "round_robin"
            if first < 0 or ctas <= 0 or first + ctas > blocks:
                fail(ploc, f"CTAs {first}..{first + ctas - 1} lie outside the grid of {blocks} CTAs",
                     f"keep the range inside 0..{blocks - 1} for {target.name}")
            for point_field in (f for f in type(s).model_fields if f.endswith("_point")):  # start_point, done_point, kinds' own
                point = getattr(s, point_field)
                if point is not None and point_field in ("start_point", "done_point") and point_field not in KINDS[s.kind].STAMPED_POINTS:
                    own = [f for f in type(s).model_fields if f.endswith("_point") and f not in ("start_point", "done_point")]
                    stamped = list(KINDS[s.kind].STAMPED_POINTS) + own
                    fail(loc + (point_field,), f"a {s.kind} stage does not stamp {point_field}",
                         f"use one of the points it stamps ({', '.join(stamped)})" if stamped else f"remove {point_field}: this kind stamps none")
                if point is not None and point not in spec.timeline_points:
                    if point_field in s.model_fields_set:
                        fail(loc + (point_field,), f"no timeline point {point!r}", f"use one of {', '.join(spec.timeline_points)}")
                    fail(loc + (point_field,), f"a {s.kind} stage stamps timeline point {point!r} ({point_field}'s default), "
                         "which timeline_points does not list",
                         f"add {point!r} to timeline_points, name another with '{point_field}: <point>', or '{point_field}: null'")
            ctx.task_count, ctx.stage_ctas = tasks, ctas
            values = KINDS[s.kind].lower(s, ctx)
            ctx.lowered[s.name] = values
            waits = tuple(d for d in s.waits_on if active.get(d))
            stages.append(StageIR(i, s.name, s.kind, s.doc, tasks, kind, first, ctas, waits, values))
        return ctx, stages

    # A stage that fits its LDS plan to what is left (a GEMV staging all its weights) cannot see
    # the kernel-lifetime buffers that later stages declare (the scorer's setup, written by an
    # earlier stage): if the whole does not fit, lower again, every stage planning around them.
    ctx, stages = lower_stages(0)
    if ctx.kernel_lds_bytes() and ctx.lds_kernel_left() < 0:
        ctx, stages = lower_stages(ctx.kernel_lds_bytes())

    # LDS: each stage's buffers packed from 0; stages share the space (union)
    offsets, by_stage = _pack_lds(ctx.lds_bufs, ctx.lds_aligns)
    lds = [LdsBuf(stage, name, ctype, count, off) for (stage, name, ctype, count), off in zip(ctx.lds_bufs, offsets)]
    timeline = build["timeline"] if "timeline" in dict(build.params) else False
    # the stamps, then the CTA's timer at its start and end and its cycles at the end (kernel.hip.j2)
    tl_slots = len(spec.timeline_points) + len(TL_EXTRA_SLOTS)
    tl_bytes = tl_slots * 8 if timeline else 0
    lds_bytes = max(by_stage.values(), default=0)
    for stage, name, ctype, count in ctx.lds_kernel_bufs:  # kernel-lifetime buffers, after the union
        lds.append(LdsBuf(stage, name, ctype, count, lds_bytes, whole_kernel=True))
        lds_bytes = _align(lds_bytes + lds[-1].nbytes, LDS_ALIGN)
    if tl_bytes:  # the timeline stamps live beside the union, for the whole kernel
        lds.append(LdsBuf("kernel", "tl", "u64", tl_slots, lds_bytes))
        lds_bytes += tl_bytes
    if lds_bytes > target.lds_bytes:
        worst = max(by_stage, key=by_stage.get)
        i = next(st.index for st in stages if st.name == worst)
        fail(("stages", i), f"LDS {lds_bytes} B exceeds {target.name}'s {target.lds_bytes} B (stage {worst!r} needs {by_stage[worst]} B)",
             "use a smaller token_tile for this target, or fewer tokens")

    tag_stride = whole(spec.mailbox.tag_stride, ("mailbox", "tag_stride"), "tag_stride", 1)

    constants = []
    for k, v in scope.items():
        if k in spec.params:
            constants.append(Const(k.upper(), v, spec.params[k].doc))
        elif k in spec.symbols:
            constants.append(Const(k, v, loaded.comment(("symbols", k))))
        else:
            constants.append(Const(k, v, DERIVED.get(k, "")))
    return KernelIR(
        spec_path=loaded.path, kernel=spec.kernel, name=spec.c_name, doc=spec.doc.strip(), build=build,
        target=target, threads=threads, blocks=blocks, smem_carveout=carveout, constants=tuple(constants), abi=tuple(abi),
        regions=tuple(regions), scratch_bytes=scratch_bytes, lds=tuple(lds), lds_bytes=lds_bytes,
        stages=tuple(stages), timeline_points=tuple(spec.timeline_points), timeline_extra=TL_EXTRA_SLOTS,
        scratch_arg=next(a.name for a in spec.abi if a.workspace == "scratch"),
        counter_arg=spec.mailbox.counter, layer_arg=spec.mailbox.layer,
        tag_stride=tag_stride, epoch_advance=spec.mailbox.advance,
        timeline_arg=next((a.name for a in spec.abi if a.workspace == "timeline"), None),
        tune=loaded.tune,
    )
