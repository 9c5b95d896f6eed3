"""The review builds of every spec, rendered into ``generated/`` (what
``make generate`` runs and what reviewers read as diffs).

One file per (spec, target, review build):
``generated/<model>/<kernel>.<target>.<build>.hip`` with ``<build>`` like
``s4`` (tokens) followed by any other non-default parameter (``s4-timeline``).
A file is written only when its content changed; files no build produces any
more are removed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .lower import Build, lower, make_build
from .render import render
from .spec import LoadedSpec, load_spec, spec_names
from .targets import TARGETS

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "generated"


def build_label(loaded: LoadedSpec, build: Build) -> str:
    """``s4``, ``s16-timeline``, ``s1-eps1e-05``: tokens, then non-defaults."""
    parts = [f"s{build.tokens}"]
    for name, value in build.params:
        if name == "tokens" or value == loaded.spec.params[name].default:
            continue
        parts.append(name if value is True else f"{name}{value}")
    return "-".join(parts)


@dataclass(frozen=True)
class ReviewBuild:
    spec: str
    target: str
    build: Build
    path: Path


def review_builds(names: list[str] | None = None) -> list[ReviewBuild]:
    """Every review build of the named specs (default: all) for every target."""
    out = []
    for name in names or spec_names():
        loaded = load_spec(name)
        builds = loaded.spec.review_builds or [{}]
        for target in TARGETS:
            for values in builds:
                build = make_build(loaded, target, **values)
                path = GENERATED / f"{name}.{target}.{build_label(loaded, build)}.hip"
                out.append(ReviewBuild(name, target, build, path))
    return out


def generate(names: list[str] | None = None, progress=None) -> tuple[list[Path], list[Path]]:
    """Render every review build; returns (files written, stale files removed)."""
    written, items = [], review_builds(names)
    for i, rb in enumerate(items):
        text = render(lower(load_spec(rb.spec), rb.build))
        if not rb.path.exists() or rb.path.read_text() != text:
            rb.path.parent.mkdir(parents=True, exist_ok=True)
            rb.path.write_text(text)
            written.append(rb.path)
        if progress:
            progress(i + 1, len(items), rb)
    removed = []
    if names is None:
        wanted = {rb.path for rb in items}
        for path in sorted(GENERATED.rglob("*.hip")):
            if path not in wanted:
                path.unlink()
                removed.append(path)
    return written, removed
