"""Launching: ``load(name, tokens=S, target=None, **flags)`` -> ``Kernel``;
``kernel(**tensors)`` checks every argument against the spec's ABI and
launches on the current torch stream.

Checks before any launch (a wrong argument is a pointer read as another,
silently): names, dtype, shape, device, contiguity, 16-byte alignment, scalar
ranges, and that no tensor the kernel writes shares memory with another
argument (but the spec's ``may_alias`` pairs). The grid must be co-resident (the stages poll each other's
mailboxes): the launcher refuses a grid larger than occupancy x SMs and uses
the backend's cooperative launch; on NVIDIA also a programmatic dependent
launch (``Kernel.pdl``).

No tensor is too small for an index the kernel forms from its build: a fixed
dimension must equal the ABI's exactly (the shape check), and the lowering
checks the ABI against the indices each stage forms (``_Ctx.abi_arg`` and
``_Ctx.region`` with shapes and counts; the workspaces' sizes). Indices read
from data at run time (positions, slots, block tables) are the caller's
contract: checking them here would mean reading the GPU before every launch.

Every checked launch runs every check; what it packs for the driver (the arguments' array,
a launch config) is kept for the last ``PREPARED_LAUNCHES`` argument sets and reused when a
launch's packed arguments equal one of them. ``kernel.bind(**tensors)`` does all of it once and
returns a launcher whose calls check only that no tensor's storage moved: eager launches
without the checks' host time.

A process runs its kernels on one GPU: the current device of the first compile (``DeviceError``
for another; the backends load a binary once a process, in that GPU's context).

Debug builds (``debug=True``): a mailbox wait gives up after 1 s and records
where; every launch is followed by ``check_errors()`` (outside graph captures),
which raises ``KernelHang`` naming the stage, task, CTA, region and tags."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace
from typing import Any

from .lower import HANG_REGION, REGION_BYTES, SCALAR_RANGES, Arg, KernelIR, lower, make_build
from .render import render
from .spec import load_spec, tune_items
from .targets import Target, get_target

ALIGN = 16  # every tensor argument: 16-byte loads and stores
SCALAR_CTYPES = {"i32": "i32", "i64": "i64", "f32": "f32"}
PREPARED_LAUNCHES = 8  # argument sets a Kernel keeps prepared for its checked calls (double buffers and the like)


class ArgumentError(ValueError):
    """A kernel argument that does not match the ABI: names the argument,
    what was expected and what was given."""


class CoResidencyError(RuntimeError):
    """The grid cannot be resident at once, so the mailbox waits could hang."""


class KernelHang(RuntimeError):
    """A debug build's mailbox wait gave up (its tag never came within the time
    limit): the launch ran to its end with stale values, so its outputs are
    invalid. ``record`` holds what the kernel wrote (see ``describe_hang``)."""

    def __init__(self, message: str, record: dict):
        super().__init__(message)
        self.record = record


class DeviceError(RuntimeError):
    """A launch on another GPU than the one this process's kernels are loaded on."""


def _claim_device(kernel: "Kernel") -> int:
    """The GPU this process's kernels are loaded on (``jit.process_device``: the backends load
    each binary once a process and launch in that GPU's context; the first compile's current
    device), which must be torch's current device: every compile and prepared launch after
    the first finds it current, or is refused (one process a GPU, as tensor-parallel serving
    runs)."""
    from . import jit

    device = jit.process_device(kernel.target, kernel.backend)
    current = _torch().cuda.current_device()
    if current != device:
        raise _device_error(kernel, current, device)
    return device


def _device_error(kernel: "Kernel", current: int, device: int) -> DeviceError:
    return DeviceError(f"{kernel.ir.kernel} [{kernel.ir.build.label()}]: cuda:{current} is the current device, but "
                       f"this process's kernels are loaded on cuda:{device} (the backend loads a binary "
                       f"once a process, in that GPU's context): run one process a GPU, or make "
                       f"cuda:{device} current (torch.cuda.set_device({device}))")


BULK_WAIT_AT = 0xFFFFFFFF  # a hang record's offset for a wait on a TMA bulk copy (kernel.hip.j2)


def hang_record(ir: KernelIR, words: list[int]) -> dict:
    """The hang record's 8 words (kernel.hip.j2: waits that gave up, stage, task,
    CTA, byte offset of the pair in scratch, tag expected, tag seen, thread) with
    the names they point at: the stage, and the scratch region and entry."""
    count, stage, task, cta, at, want, seen, thread = [w & 0xFFFFFFFF for w in words]
    st = next((s for s in ir.stages if s.index == stage), None)
    region = next((r for r in ir.regions if r.offset <= at < r.offset + r.nbytes), None)
    return {
        "waits": count, "stage_index": stage, "stage": st.name if st else None, "kind": st.kind if st else None,
        "task": task - (1 << 32) if task >= 1 << 31 else task, "cta": cta, "thread": thread, "offset": at,
        "region": region.name if region else None,
        "entry": (at - region.offset) // REGION_BYTES[region.kind] if region else None,
        "tag": want, "seen": seen,
    }


def describe_hang(ir: KernelIR, rec: dict) -> str:
    """One message naming the stage, the task and CTA, the region and entry,
    and the tags expected and seen (a tag is epoch * stride + layer + 1)."""
    def tag(t):
        if t == 0:
            return "0 (never written)"
        epoch, rest = divmod(t - 1, ir.tag_stride)
        return f"{t} (epoch {epoch}" + (f", layer {rest})" if ir.layer_arg else ")")

    stage = f"stage {rec['stage_index']} {rec['stage']!r} ({rec['kind']})" if rec["stage"] else f"stage {rec['stage_index']}"
    if rec["offset"] == BULK_WAIT_AT:
        return (f"{ir.kernel} [{ir.target.name} {ir.build.label()}]: a TMA bulk copy's wait gave up after 1 s: "
                f"{stage}, task {rec['task']} on CTA {rec['cta']} (thread {rec['thread']}): its mbarrier (phase "
                f"{rec['tag']}) never saw all the bytes it expects land (a byte count the copies do not reach, or a "
                f"faulting source); {rec['waits']} wait(s) gave up, later ones returned at once: this launch's "
                "outputs are invalid")
    where = (f"region {rec['region']!r} entry {rec['entry']}" if rec["region"]
             else f"a pair outside the scratch buffer (offset {rec['offset']})")
    return (f"{ir.kernel} [{ir.target.name} {ir.build.label()}]: a mailbox wait gave up after 1 s: {stage}, "
            f"task {rec['task']} on CTA {rec['cta']} (thread {rec['thread']}), waiting on {where} for tag "
            f"{tag(rec['tag'])}, saw tag {tag(rec['seen'])}; {rec['waits']} wait(s) gave up, later ones returned "
            "at once: this launch's outputs are invalid")


def _torch():
    import torch

    return torch


def torch_dtype(dtype: str, target: Target):
    """The torch dtype of an ABI dtype (``fp8`` is the target's flavour)."""
    torch = _torch()
    if dtype == "fp8":
        return getattr(torch, target.torch_fp8_dtype_name)
    return {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32, "i64": torch.int64,
            "u8": torch.uint8}[dtype]


def detect_target() -> str:
    """The target of torch's current GPU."""
    torch = _torch()
    if not torch.cuda.is_available():
        raise RuntimeError("no GPU visible to torch: pass target='sm90' / 'gfx942' / 'gfx950' to render or report only")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    arch = getattr(props, "gcnArchName", "") or ""
    if getattr(torch.version, "hip", None):
        name = arch.split(":")[0]
        get_target(name)
        return name
    if (props.major, props.minor) == (9, 0):
        return "sm90"
    raise RuntimeError(f"GPU {props.name} (sm_{props.major}{props.minor}) is not a supported target (sm90, gfx942, gfx950)")


@dataclass
class Kernel:
    """One build of a spec, compiled on first launch. ``kernel(**tensors)``."""

    ir: KernelIR
    source: str
    backend: str | None = None
    cooperative: bool = True
    # NVIDIA: programmatic dependent launch. The kernel lets the stream's next launch begin
    # as soon as all its CTAs have started, and waits for the previous launch's completion
    # before any memory access (kernel.hip.j2), so launches overlap their ramp-up and drain
    # (H200 bench, back to back: DeepSeek -0.6..-0.8 us a launch, MiniMax -0.3..-1.5;
    # bench/NOTES.md session 24). AMD: no such launch; ignored
    pdl: bool = True

    def __post_init__(self):
        self._function = None
        self._device = None  # the process's kernel device (_claim_device), once compiled
        self.co_resident_ctas = None  # occupancy x SMs, once loaded
        self._scratch = None  # debug builds: the scratch buffer of the last launch (its hang record)
        # packed arguments -> their prepared launch: a checked call with the arguments of a
        # recent one (a decode loop's) skips packing the driver's arrays again
        self._prepared_launches: dict[tuple, Any] = {}
        self._prepared_lock = threading.Lock()  # a miss adds and drops entries; a hit only reads

    @functools.cached_property
    def debug(self) -> bool:
        """A debug build: mailbox waits give up after 1 s and record where
        (``check_errors``); the scratch buffer ends with the hang record."""
        return any(r.name == HANG_REGION for r in self.ir.regions)

    def check_errors(self, scratch=None) -> None:
        """Debug builds: wait for the GPU, then raise ``KernelHang`` if a mailbox
        wait of a launch since the last check gave up (and clear the record, so
        the next launch starts clean). ``scratch``: the buffer those launches
        used (default: the last launch's). Release builds: nothing to check."""
        if not self.debug:
            return
        scratch = scratch if scratch is not None else self._scratch
        if scratch is None:
            return  # never launched
        torch = _torch()
        r = self.ir.region(HANG_REGION)
        if scratch.is_cuda:
            torch.cuda.synchronize(scratch.device)
        view = scratch[r.offset: r.offset + r.nbytes].view(torch.int32)
        words = view.tolist()
        if words[0] == 0:
            return
        view.zero_()
        rec = hang_record(self.ir, words)
        raise KernelHang(describe_hang(self.ir, rec), rec)

    @property
    def name(self) -> str:
        return self.ir.name

    @property
    def target(self) -> Target:
        return self.ir.target

    @property
    def dynamic_lds(self) -> int:
        """NVIDIA kernels declare their LDS dynamically (over 48 KiB needs it)."""
        return self.ir.lds_bytes if self.target.vendor == "nvidia" else 0

    @property
    def file_name(self) -> str:
        """The name the source is compiled (and its errors reported) under; part of its cache key."""
        return f"{self.ir.kernel.replace('/', '_')}.{self.target.name}.hip"

    def binary(self) -> bytes:
        """The loadable binary, compiled (or taken from the disk cache); needs no GPU."""
        from . import jit

        return jit.compile_binary(self.source, self.file_name, self.target, self.backend)

    def with_source(self, source: str) -> "Kernel":
        """The same build (IR, backend, launch modes) compiled from ``source``: a probe's twin
        (scripts/no_mma.py and its kin), or a test's build with a stage cut out."""
        return replace(self, source=source)

    def compile(self):
        """Compile (or take from the disk cache) and load on this process's GPU (the first
        compile's current device; ``DeviceError`` if another is current); check co-residency."""
        self._device = _claim_device(self)
        if self._function is not None:
            return self._function
        from . import jit

        module = jit.load_module(self.binary(), self.target, self.backend)
        fn = module.function(self.name)
        if self.dynamic_lds > 48 * 1024:
            fn.set_max_dynamic_shared(self.dynamic_lds)
        if self.ir.smem_carveout >= 0:  # NVIDIA only (lowering refuses it elsewhere)
            fn.set_shared_carveout(self.ir.smem_carveout)
        per_cu = fn.max_active_blocks_per_sm(self.ir.threads, self.dynamic_lds)
        units = _compute_units()
        self.co_resident_ctas = per_cu * units
        if self.co_resident_ctas < self.ir.blocks:
            attrs = fn.attributes()
            raise CoResidencyError(
                f"{self.ir.kernel} [{self.ir.build.label()}]: {self.ir.blocks} CTAs cannot be co-resident: "
                f"{per_cu} CTA(s) of {self.ir.threads} threads fit per CU/SM x {units} = {self.co_resident_ctas} "
                f"(registers {attrs.get('num_regs')}, LDS {self.ir.lds_bytes} B); lower grid.blocks for "
                f"{self.target.name} in the spec"
            )
        self._function = fn
        return fn

    def workspace(self, device=None) -> dict[str, Any]:
        """Fresh buffers for the ABI's workspace arguments (scratch zeroed once,
        step counter, timeline), keyed by argument name. Reuse them across
        launches: the kernel never needs them cleared again."""
        torch = _torch()
        device = torch.device(device if device is not None else "cuda")
        out = {}
        for a in self.ir.abi:
            if a.workspace is None:
                continue
            if a.workspace == "timeline" and not dict(self.ir.build.params).get("timeline", False):
                out[a.name] = None
                continue
            if any(isinstance(d, str) for d in a.shape):
                raise ValueError(f"workspace argument {a.name!r} has a runtime dimension: give it a fixed shape")
            out[a.name] = torch.zeros(a.shape, dtype=torch_dtype(a.dtype, self.target), device=device)
        return out

    def pack(self, tensors: dict[str, Any]) -> list[tuple[str, int | float]]:
        """The launch arguments in ABI order, after every check."""
        placed, _ = self._pack(tensors)
        self._check_overlaps(tensors, placed)
        return placed

    def _pack(self, tensors: dict[str, Any]) -> tuple[list[tuple[str, int | float]], tuple]:
        """``pack`` but the overlap check (which the packed arguments and the runtime dimensions'
        sizes, returned second, settle: a checked launch runs it once an argument set)."""
        names = [a.name for a in self.ir.abi]
        unknown = sorted(set(tensors) - set(names))
        if unknown:
            raise ArgumentError(f"{self.ir.kernel}: unknown argument(s) {', '.join(unknown)}; the ABI is {', '.join(names)}")
        missing = [n for n in names if n not in tensors and not self.ir.arg(n).optional]
        if missing:
            raise ArgumentError(f"{self.ir.kernel}: missing argument(s) {', '.join(missing)} "
                                "(workspace arguments come from kernel.workspace(device))")
        dims: dict[str, tuple[str, int]] = {}  # runtime dimension -> (first argument, size)
        # what the arguments are (type, dtype, shape, layout) for all of them first, then
        # where they are (device, alignment): a wrong shape is named before a wrong device
        packed = [self._check(a, tensors.get(a.name), dims) for a in self.ir.abi]
        current_device = functools.cache(_torch().cuda.current_device)  # asked once, if a tensor is on a GPU
        placed = [self._place(a, tensors.get(a.name), p, current_device) for a, p in zip(self.ir.abi, packed)]
        return placed, tuple(size for _, size in dims.values())

    def _check_overlaps(self, tensors: dict[str, Any], placed: list[tuple[str, int | float]]) -> None:
        """No tensor the kernel writes may share memory with another argument (its reads and
        writes would race, or one output overwrite another), but where the spec says the two
        may alias (``may_alias``: views of one allocation whose parts the kernel keeps apart)."""
        spans = sorted((address, address + tensors[name].nbytes, i) for i, name in self._tensor_positions
                       if (address := placed[i][1]))  # (a None optional tensor is address 0)
        reach = 0  # the furthest end of the spans so far: only a span that starts below it overlaps one
        for k, (start, end, i) in enumerate(spans):
            if start < reach and end > start:
                self._refuse_overlap(spans[:k], start, end, i)
            reach = max(reach, end)

    def _refuse_overlap(self, earlier: list[tuple[int, int, int]], start: int, end: int, i: int) -> None:
        """``_check_overlaps``' span (start, end) of argument ``i`` against the ``earlier`` spans
        that reach into it: an error for the first pair not allowed."""
        a = self.ir.abi[i]
        for other_start, other_end, j in earlier:
            b = self.ir.abi[j]
            if other_end > start and (a.intent != "in" or b.intent != "in") and b.name not in a.may_alias:
                written = " and ".join(repr(x.name) for x in (b, a) if x.intent != "in")
                raise ArgumentError(
                    f"{self.ir.kernel}: arguments {b.name!r} (0x{other_start:x}..0x{other_end:x}) and {a.name!r} "
                    f"(0x{start:x}..0x{end:x}) share memory, and the kernel writes {written}: give each "
                    "its own memory (only the spec's may_alias pairs may overlap)")

    @functools.cached_property
    def _tensor_positions(self) -> list[tuple[int, str]]:
        """(ABI position, name) of every tensor argument."""
        return [(i, a.name) for i, a in enumerate(self.ir.abi) if a.is_tensor]

    @functools.cached_property
    def _tensor_checks(self) -> dict[str, tuple[Any, tuple[int, ...] | None]]:
        """Each tensor argument's torch dtype and, when no dimension is a runtime one, its
        shape: what ``_check`` compares, worked out once."""
        return {a.name: (torch_dtype(a.dtype, self.target),
                         a.shape if all(isinstance(d, int) for d in a.shape) else None)
                for a in self.ir.abi if a.is_tensor}

    def _where(self, name: str) -> str:
        """An argument's name as every ArgumentError starts with it."""
        return f"{self.ir.kernel} argument {name!r}"

    def _check(self, a: Arg, value, dims: dict) -> tuple[str, int | float]:
        torch = _torch()
        if not a.is_tensor:
            if a.dtype == "f32":
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise ArgumentError(f"{self._where(a.name)}: expected a float, got {type(value).__name__}")
            elif not isinstance(value, int) or isinstance(value, bool):
                raise ArgumentError(f"{self._where(a.name)}: expected an int ({a.dtype}), got {type(value).__name__}")
            lo, hi = a.range if a.range is not None else SCALAR_RANGES.get(a.dtype, (value, value))
            if not lo <= value <= hi:
                raise ArgumentError(f"{self._where(a.name)}: expected a value in [{lo}, {hi}], got {value}")
            return (SCALAR_CTYPES[a.dtype], value)
        if value is None:
            if a.optional:
                return ("u64", 0)
            raise ArgumentError(f"{self._where(a.name)}: expected a tensor, got None")
        if not isinstance(value, torch.Tensor):
            raise ArgumentError(f"{self._where(a.name)}: expected a torch.Tensor, got {type(value).__name__}")
        want, fixed_shape = self._tensor_checks[a.name]
        if value.dtype != want:
            raise ArgumentError(f"{self._where(a.name)}: expected dtype {want}, got {value.dtype}")
        if fixed_shape is not None:
            if value.shape != fixed_shape:
                raise ArgumentError(f"{self._where(a.name)}: expected shape {a.shape_text}, got {list(value.shape)}")
        else:
            if value.dim() != len(a.shape) or any(
                isinstance(d, int) and d != n for d, n in zip(a.shape, value.shape)
            ):
                raise ArgumentError(f"{self._where(a.name)}: expected shape {a.shape_text}, got {list(value.shape)}")
            for d, n in zip(a.shape, value.shape):
                if isinstance(d, str):
                    if n <= 0:
                        raise ArgumentError(f"{self._where(a.name)}: runtime dimension {d} must be positive, got {n}")
                    first = dims.setdefault(d, (a.name, n))
                    if first[1] != n:
                        raise ArgumentError(f"{self._where(a.name)}: dimension {d} = {n} disagrees with {first[0]!r} "
                                            f"({d} = {first[1]})")
        if not value.is_contiguous():
            raise ArgumentError(f"{self._where(a.name)}: expected a contiguous tensor, "
                                f"got strides {list(value.stride())}")
        return ("u64", 0)  # the address once placed

    def _place(self, a: Arg, value, packed: tuple[str, int | float], current_device) -> tuple[str, int | float]:
        """The device and alignment checks of a tensor argument; its address. ``current_device``:
        torch's current device index (a call)."""
        if not a.is_tensor or value is None:
            return packed
        if not value.is_cuda:
            raise ArgumentError(f"{self._where(a.name)}: expected a tensor on the GPU, got device {value.device}")
        if value.get_device() != current_device():
            raise ArgumentError(f"{self._where(a.name)}: expected device cuda:{current_device()} "
                                f"(the current device), got {value.device}")
        address = value.data_ptr()
        if address % ALIGN:
            raise ArgumentError(f"{self._where(a.name)}: expected a {ALIGN}-byte aligned address, got 0x{address:x}")
        return ("u64", address)

    def __call__(self, **tensors) -> None:
        """Launch on the current torch stream (capturable into a CUDA graph)."""
        args, sizes = self._pack(tensors)
        key = (*args, sizes)  # the addresses and every tensor's extent: what the overlap check saw
        prepared = self._prepared_launches.get(key)
        if prepared is None:
            self._check_overlaps(tensors, args)
            prepared = self._prepare(args)
            with self._prepared_lock:
                while len(self._prepared_launches) >= PREPARED_LAUNCHES:
                    del self._prepared_launches[next(iter(self._prepared_launches))]  # the oldest
                self._prepared_launches[key] = prepared
        self._launch(prepared, tensors)

    def bind(self, **tensors) -> "BoundLaunch":
        """Every check of ``kernel(**tensors)`` once, now, and the driver's launch prepared (the
        kernel compiled): a launcher for these arguments whose calls check only that no tensor's
        storage moved (for eager launches, where the ~30 arguments' checks and packing cost far
        more host time than the kernel takes on the GPU)."""
        return BoundLaunch(self, dict(tensors), self.pack(tensors))

    def _prepare(self, args: list[tuple[str, int | float]]):
        """The compiled function's launch with these packed arguments, prepared (its calls take the stream)."""
        return self.compile().prepare(self.ir.blocks, self.ir.threads, self.dynamic_lds, args,
                                      cooperative=self.cooperative, pdl=self.pdl and self.target.vendor == "nvidia")

    def _launch(self, prepared, tensors: dict[str, Any]) -> None:
        """``prepared`` (``_prepare``) on the current torch stream; in debug builds, the error check."""
        torch = _torch()
        device = torch.cuda.current_device()
        if device != self._device:  # a bound launch's device made no longer current
            raise _device_error(self, device, self._device)
        prepared(_current_stream_handle(device))
        if self.debug:  # every launch is checked, except inside a graph capture (check_errors after replays)
            self._scratch = tensors[self.ir.scratch_arg]
            if not torch.cuda.is_current_stream_capturing():
                self.check_errors()


@dataclass(repr=False)
class BoundLaunch:
    """``kernel.bind(**tensors)``: the arguments checked and packed once; ``bound()`` launches
    with them on the current torch stream. It holds the tensors (their memory stays theirs), and
    each call checks only their addresses: a tensor whose storage moved since (``set_``, a
    resize that reallocates) is refused by name, but a shape changed in place on the same storage
    is not seen. New tensors, or new shapes, need ``bound.rebind(**changed)``, which checks the
    whole set again. Values written into the bound tensors between calls are what it is for."""

    kernel: Kernel
    tensors: dict[str, Any]
    args: list[tuple[str, int | float]]

    def __post_init__(self):
        abi = self.kernel.ir.abi
        # (name, tensor, its packed address) of every tensor given: what a call checks
        self._addresses = [(a.name, self.tensors[a.name], packed[1]) for a, packed in zip(abi, self.args)
                           if a.is_tensor and self.tensors.get(a.name) is not None]
        self._prepared = self.kernel._prepare(self.args)

    def __call__(self) -> None:
        for name, tensor, address in self._addresses:
            if tensor.data_ptr() != address:
                raise ArgumentError(f"{self.kernel._where(name)}: its storage moved since bind() "
                                    f"(bound at 0x{address:x}, now 0x{tensor.data_ptr():x}); bind it again "
                                    f"(bound.rebind({name}=...))")
        self.kernel._launch(self._prepared, self.tensors)

    def __repr__(self) -> str:
        return f"BoundLaunch({self.kernel.ir.kernel} [{self.kernel.ir.build.label()}], {len(self.args)} arguments)"

    def rebind(self, **changed) -> "BoundLaunch":
        """The same launch with some arguments replaced, every argument checked again."""
        return self.kernel.bind(**{**self.tensors, **changed})


def _current_stream_handle(device: int) -> int:
    """torch's current stream on ``device`` as the driver's handle (``cudaStream_t`` /
    ``hipStream_t``), through torch's raw getter, the one inductor's generated code calls:
    0.1-0.2 us, where ``current_stream(device).cuda_stream`` builds a Stream object first,
    5-7 us of a bound launch's 15-22 on an H100 host (scripts/host_launch_time.py, session 57).
    A torch without the getter takes the public way."""
    torch = _torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _compute_units() -> int:
    torch = _torch()
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@functools.lru_cache(maxsize=None)
def _kernel(name: str, target: str, params: tuple, backend: str | None, cooperative: bool, tune: tuple = (),
            pdl: bool = True) -> Kernel:
    loaded = load_spec(name, tune)
    build = make_build(loaded, target, **dict(params))
    ir = lower(loaded, build)
    return Kernel(ir, render(ir), backend, cooperative, pdl)


def load(name: str, tokens: int = 1, target: str | None = None, backend: str | None = None,
         cooperative: bool = True, tune: dict | None = None, pdl: bool = True, **flags) -> Kernel:
    """The kernel of spec ``name`` for ``tokens`` rows and build ``flags`` on
    ``target`` (default: torch's current GPU). Compiles on first launch (or
    ``kernel.compile()``); the same build is returned from an in-process cache.
    ``tune``: overrides of the spec's stage fields for a tuning sweep, e.g.
    ``{"qkv.bulk_copies": 0}`` (checked like the file's values). ``pdl``
    (NVIDIA): programmatic dependent launch (``Kernel.pdl``); False launches
    each kernel after the previous one's completion, as a plain launch does."""
    target = target or detect_target()
    return _kernel(name, target, tuple(sorted(dict(tokens=tokens, **flags).items())), backend, cooperative,
                   tune_items(tune), pdl)


class PrecompileError(RuntimeError):
    """A build of ``precompile`` did not compile (or was refused); the message names the build
    and carries the original error's text (a worker's own exception does not cross processes whole)."""


def _compile_build(build: dict) -> str:
    """One precompile job (a worker process): ``build`` as ``load``'s keywords, ``name`` among them."""
    flags = dict(build)
    try:
        kernel = load(flags.pop("name"), **flags)
        kernel.binary()
    except Exception as e:
        shown = ", ".join(f"{k}={v!r}" for k, v in build.items())
        raise PrecompileError(f"precompile({shown}): {type(e).__name__}: {e}") from None
    return kernel.ir.build.label()


def precompile(builds, workers: int | None = None, errors: str = "raise") -> list:
    """Compile every build of ``builds`` into the disk cache ($MONO_CACHE_DIR) in
    parallel processes, so that the first launch of each only loads its binary (a
    MiniMax build: nvrtc ~0.05 s on the H200 host, ~2.4 s on a 2-core machine). Each
    build is a dict of ``load``'s keywords with the spec's ``name`` among them, e.g.
    ``dict(name="minimax_m3/pre_attn", tokens=4, tune={"qkv.bulk_copies": 0})``;
    ``target`` defaults to the current torch device's (fixed here: the workers need no
    GPU). ``workers``: processes (default one per CPU, at most one per build). Returns
    the builds' labels in order. A build that does not compile or that its spec refuses
    raises PrecompileError naming it, or with ``errors="keep"`` stands in the list as its
    PrecompileError (the others compiled)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import os

    if errors not in ("raise", "keep"):
        raise ValueError(f"precompile: errors={errors!r}, expected 'raise' or 'keep'")
    jobs = []
    for b in builds:
        if "name" not in b:
            raise TypeError(f"precompile: build {b!r} has no 'name' (the spec, e.g. 'minimax_m3/pre_attn')")
        jobs.append(dict(b, target=b.get("target") or detect_target()))
    if not jobs:
        return []
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_compile_build, b) for b in jobs]
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except PrecompileError as e:
                if errors == "raise":
                    raise
                out.append(e)
        return out
