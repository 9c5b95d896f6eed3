"""What the benchmark cases (bench/minimax.py, bench/deepseek.py) share: the
three contenders one call per weight copy, the warm-up's compiles, the guard's
checks and the release of their tensors. A case adds its inputs, ``_ours``,
``_unfused``, the guard's comparisons and the bytes that must move."""

from __future__ import annotations

import time
from typing import Callable

import torch


class GuardError(RuntimeError):
    """A contender's output disagrees with the others before timing."""


class Checks:
    """The guard's named checks: ``check(name, ok, detail)`` records each; a
    failed one is raised by ``raise_failures`` after all ran (so the report
    lists every disagreement, not just the first)."""

    def __init__(self):
        self.results: dict[str, dict] = {}
        self.failures: list[str] = []

    def __call__(self, name: str, ok: bool, detail: dict | None = None) -> None:
        self.results[name] = {"ok": bool(ok), **(detail or {})}
        if not ok:
            self.failures.append(f"{name}: {detail}")

    def raise_failures(self, what: str) -> dict[str, dict]:
        if self.failures:
            raise GuardError(f"{what}: contenders disagree, not timing:\n  " + "\n  ".join(self.failures))
        return self.results


class BenchCase:
    """The shared part of a case: ``self.unfused`` (the eager chain),
    ``self.compiled`` (its torch.compile or None), ``self.kernel``,
    ``self.copies``, ``self.device``; ``RELEASE`` names the tensors to drop."""

    RELEASE: tuple[str, ...] = ()

    def contenders(self) -> dict[str, list[Callable[[], object]]]:
        """name -> one call per weight copy."""
        out = {
            "ours": [lambda i=i: self._ours(i) for i in range(self.copies)],
            "eager": [lambda i=i: self._unfused(self.unfused, i) for i in range(self.copies)],
        }
        if self.compiled is not None:
            out["compile"] = [lambda i=i: self._unfused(self.compiled, i) for i in range(self.copies)]
        return out

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _compile_ours(self, out: dict) -> None:
        """Our kernel's JIT compile (or disk-cache load), timed."""
        if not self.dry_run:
            t0 = time.perf_counter()
            self.kernel.compile()
            out["ours_compile_s"] = time.perf_counter() - t0

    def _compile_chain(self, out: dict) -> None:
        """The compiled chain's first call (its compile for this S), timed; a
        failure drops the compile contender with a note."""
        if self.compiled is None:
            return
        t0 = time.perf_counter()
        try:
            self._unfused(self.compiled, 0)
            self._sync()
            out["torch_compile_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - reported, the run goes on without it
            msg = f"torch.compile failed for S={self.tokens}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            self.notes.append(msg)
            self.log("NOTE: " + msg)
            self.compiled = None

    @staticmethod
    def _span(t: torch.Tensor) -> int:
        """The pool bytes one workspace tensor takes in ``place_workspace``: its own, 256-aligned."""
        return -(-t.numel() * t.element_size() // 256) * 256

    def place_workspace(self, pool: torch.Tensor | None, offset: int = 0) -> int:
        """Ours's workspace (``self.ws``: scratch, step counter) moved to ``pool[offset:]``, each
        tensor 256-byte aligned after the previous one and zeroed (a fresh workspace: counter 0,
        no tags); ``pool`` None: back to the buffers the case allocated. Returns the scratch's
        address. Why: DeepSeek's time at some S follows where its workspace lies (bench/NOTES.md,
        DeepSeek session 45), so the bench can time ours over several places (--places)."""
        if getattr(self, "_own_ws", None) is None:
            self._own_ws = dict(self.ws)
        if pool is None:
            placed = dict(self._own_ws)
        else:
            placed, at = {}, offset
            for name, t in self._own_ws.items():
                if t is None:  # the timeline buffer of a build without stamps
                    placed[name] = None
                    continue
                span = self._span(t)
                if at + span > pool.numel():
                    raise ValueError(f"place_workspace: {name} ({span} B with its alignment) at offset {at} "
                                     f"overruns the {pool.numel()}-byte pool: make the pool workspace_bytes() "
                                     "past the last offset")
                placed[name] = pool[at: at + t.numel() * t.element_size()].view(t.dtype).view(t.shape).zero_()
                at += span
        self.ws = placed
        self.base_args.update({k: v for k, v in placed.items() if k in self.base_args})
        return placed["scratch"].data_ptr()

    def workspace_bytes(self) -> int:
        """The pool bytes one place of ``place_workspace`` takes."""
        own = getattr(self, "_own_ws", None) or self.ws
        return sum(self._span(t) for t in own.values() if t is not None)

    def release(self) -> None:
        for name in self.RELEASE + ("_own_ws",):
            setattr(self, name, None)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
