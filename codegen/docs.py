"""``docs/spec-reference.md``, generated from the pydantic models of the spec
layer: every field of ``KernelSpec`` and of the models under it, and every
stage kind in ``codegen.stages.KINDS``, with its type, default and description.

A field's description is its ``Field(description=...)``, else the ``#``
comment on its line in the model's source (how the stage models document
their fields), else, for the top level only, ``TOP_LEVEL_NOTES``. The text is
deterministic; ``python -m codegen docs`` writes it and a test keeps the
committed file equal to ``spec_reference()``."""

from __future__ import annotations

import ast
import inspect
import io
import json
import textwrap
import tokenize
import types
import typing
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
SPEC_REFERENCE = ROOT / "docs" / "spec-reference.md"

# What the top-level fields hold, where KernelSpec's source says nothing.
TOP_LEVEL_NOTES = {
    "kernel": "`<model>/<kernel>`: names the file (`specs/<model>/<kernel>.yaml`) and the C symbol",
    "doc": "what the kernel computes, in prose; printed in the generated file's header",
    "symbols": "the model's constants: name -> integer, number or expression over earlier symbols and parameters, "
               "or per target (`{default: 2, sm90: 4}`)",
    "params": "build parameters: a kernel binary is compiled for one value of each; `tokens` is required",
    "review_builds": "parameter sets rendered into `generated/` for review (one file per target and entry)",
    "grid": "threads per CTA and CTAs per target; every CTA must be co-resident",
    "timeline_points": "names of the timeline stamps; `start` and `stages_done` are stamped by the kernel itself",
    "abi": "the kernel's arguments, in order: signature, launcher checks and op schema",
    "mailbox": "where the epoch counter and the layer id of the mailbox tag come from",
    "scratch": "mailbox regions of the scratch buffer, in order, each 256-byte aligned",
    "stages": "the task tables, in the order every CTA runs them",
}
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"


def _doc(obj) -> str:
    d = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    return inspect.cleandoc(d) if d else ""


@lru_cache(maxsize=None)
def _comments(cls: type) -> dict[str, str]:
    """The ``# comment`` on each annotated field's line in ``cls``'s own source, else the
    comment lines right above the field (a longer note)."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    by_line, alone = {}, set()  # alone: lines that hold nothing but their comment
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
            if tok.line.strip().startswith("#"):
                alone.add(tok.start[0])
    out = {}
    for node in ast.parse(src).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            on_line = [by_line[n] for n in range(node.lineno, node.end_lineno + 1) if n in by_line]
            above = []
            for n in range(node.lineno - 1, 0, -1):
                if n not in alone:
                    break
                above.insert(0, by_line[n])
            note = on_line[0] if on_line else " ".join(above)
            if note:
                out[node.target.id] = note
    return out


def _description(cls: type, name: str, field) -> str:
    if field.description:
        return field.description
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            note = _comments(klass).get(name)
            if note:
                return note
            break
    return ""


def _aliases() -> list[tuple[object, str]]:
    from .spec.models import Expr, Name

    return [(Name, "name"), (Expr, "expr"), (Expr | None, "expr or null")]


def _stage_models() -> set[type]:
    from .stages import KINDS

    return {m.Model for m in KINDS.values()}


def _type(tp, links: list[type]) -> str:
    """A reader's name for annotation ``tp``; models it names are added to ``links``."""
    for alias, text in _aliases():
        if tp == alias:
            return text
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if tp in (int, float, bool, str):
        return {int: "integer", float: "number", bool: "boolean", str: "string"}[tp]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if tp in _stage_models():
            return "stage"
        if tp not in links:
            links.append(tp)
        return f"[{tp.__name__}](#{tp.__name__.lower()})"
    if origin is typing.Annotated:
        meta = args[1:]
        patterns = [getattr(m, "pattern", None) for m in meta] + [
            getattr(x, "pattern", None) for m in meta for x in getattr(m, "metadata", [])
        ]
        pattern = next((p for p in patterns if p), None)
        if pattern == IDENTIFIER:
            return "name"
        if pattern:
            return f"string matching `{pattern}`"
        return _type(args[0], links)
    if origin is typing.Literal:
        return f"`{args[0]}`" if len(args) == 1 else "one of " + ", ".join(f"`{v}`" for v in args)
    if origin in (typing.Union, types.UnionType):
        if all(isinstance(a, type) and a in _stage_models() for a in args):
            return "stage: one of the [stage kinds](#stage-kinds), chosen by `kind`"
        return " or ".join(_type(a, links) for a in args)
    if origin is list:
        return f"list of {_grouped(args[0], links)}"
    if origin is dict:
        return f"mapping of {_grouped(args[0], links)} to {_grouped(args[1], links)}"
    if origin is tuple:
        return "[" + ", ".join(_type(a, links) for a in args) + "]"
    return str(tp)


def _grouped(tp, links: list[type]) -> str:
    """``_type``, in parentheses where it is a choice ("list of (a or b)")."""
    text = _type(tp, links)
    choice = typing.get_origin(tp) in (typing.Union, types.UnionType) and " or " in text
    return f"({text})" if choice else text


def _hints(cls: type) -> dict:
    """The field annotations of ``cls`` with ``Annotated`` kept and forward
    references resolved (pydantic's own may still hold a ForwardRef)."""
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except (NameError, TypeError):
        return {}


def _constraints(field) -> tuple[str | None, list[str]]:
    """The field's string pattern (pydantic moves it off the annotation) and
    its other bounds, in words."""
    pattern, out = None, []
    for m in field.metadata:
        kind = type(m).__name__
        if getattr(m, "pattern", None):
            pattern = m.pattern
        elif kind == "Gt":
            out.append(f"> {m.gt}")
        elif kind == "Ge":
            out.append(f">= {m.ge}")
        elif kind == "MinLen":
            out.append(f"at least {m.min_length}")
        elif kind == "MaxLen":
            out.append(f"at most {m.max_length}")
    return pattern, out


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(cls: type, names: list[str], links: list[type], notes: dict[str, str] | None = None) -> list[str]:
    rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name in names:
        f = cls.model_fields[name]
        key = f.alias or name
        tp = _type(_hints(cls).get(name, f.annotation), links)
        pattern, bounds = _constraints(f)
        if pattern:
            tp = "name" if pattern == IDENTIFIER else f"string matching `{pattern}`"
        if bounds:
            tp += f" ({', '.join(bounds)})"
        desc = _description(cls, name, f) or (notes or {}).get(name, "")
        rows.append(f"| `{key}` | {_cell(tp)} | {_cell(_default(f))} | {_cell(desc)} |")
    return rows


def spec_reference() -> str:
    """The text of ``docs/spec-reference.md``."""
    from . import expr
    from .spec.kernel import DERIVED, REQUIRED_TIMELINE_POINTS, KernelSpec
    from .spec.models import StageBase
    from .stages import KINDS
    from .targets import TARGETS

    links: list[type] = []
    out = [
        "# Spec reference",
        "",
        "<!-- generated by codegen.docs.spec_reference (python -m codegen docs); do not edit -->",
        "",
        "A spec is one YAML file, `specs/<model>/<kernel>.yaml`, validated by the pydantic models of",
        "`codegen/spec/` and the stage kinds of `codegen/stages/`. Unknown fields are errors, and every",
        "error names the file, the line and the field path. Types: *name* is an identifier",
        f"(`{IDENTIFIER}`); *expr* is an integer or an [expression](#expressions) over the spec's symbols,",
        "its build parameters and the [derived symbols](#derived-symbols).",
        "",
        "## KernelSpec",
        "",
        (_doc(KernelSpec)),
        "",
        *_table(KernelSpec, list(KernelSpec.model_fields), links, TOP_LEVEL_NOTES),
        "",
        f"Timeline points every spec lists: {', '.join(f'`{p}`' for p in REQUIRED_TIMELINE_POINTS)}.",
        "",
        "## Derived symbols",
        "",
        "Defined by the lowering for every build; usable in shapes, counts and conditions.",
        "",
        "| symbol | value |",
        "| --- | --- |",
        *[f"| `{k}` | {_cell(v)} |" for k, v in DERIVED.items()],
        "",
        "## Expressions",
        "",
        (_doc(expr)),
        "",
    ]
    # stage fields first, so that the models they name join the list below
    stage_sections = [
        "## Stage kinds",
        "",
        "Every stage has the common fields of `StageBase`, then those of its kind (`kind` picks the kind).",
        "",
        "### Common stage fields",
        "",
        (_doc(StageBase)),
        "",
        *_table(StageBase, [n for n in StageBase.model_fields if n != "kind"], links),
        "",
    ]
    common = set(StageBase.model_fields)
    for kind, mod in sorted(KINDS.items()):
        model = mod.Model
        path = Path(inspect.getfile(mod)).resolve().relative_to(ROOT).as_posix()
        stage_sections += [
            f"### {kind}",
            "",
            f"`{path}`, template `templates/stages/{kind}.j2`.",
            "",
            (_doc(mod)),
            "",
            *_table(model, ["kind"] + [n for n in model.model_fields if n not in common], links),
            "",
        ]
    # the models the top level and the stages name, in the order first named
    seen = 0
    while seen < len(links):
        cls = links[seen]
        seen += 1
        out += [f"## {cls.__name__}", ""]
        if _doc(cls):
            out += [(_doc(cls)), ""]
        out += [*_table(cls, list(cls.model_fields), links), ""]
    out += stage_sections
    out += [
        "## Targets",
        "",
        "| target | part | wave | CUs/SMs | LDS per CTA | FP8 | max e4m3 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[f"| `{t.name}` | {t.part} | {t.wave_size} | {t.compute_units} | {t.lds_bytes // 1024} KiB | "
          f"e4m3 {t.fp8_flavour} | {t.fp8_max:g} |" for t in TARGETS.values()],
        "",
    ]
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"


def write_spec_reference(path: Path | None = None) -> bool:
    """Write the reference (default ``docs/spec-reference.md``) if its content
    changed; True when written."""
    path = path or SPEC_REFERENCE
    text = spec_reference()
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True
