"""Reading a spec file: YAML with positions, pydantic validation, semantic
checks; every problem becomes a located ``SpecIssue``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from ..errors import SpecError, SpecIssue
from ..yamlpos import Positions, YamlSyntaxError, load
from .kernel import KernelSpec, semantic_issues

SPECS_DIR = Path(__file__).resolve().parents[2] / "specs"

_HINTS = {
    "missing": "add this field",
    "extra_forbidden": "remove it, or check its spelling against the spec reference (docs/spec-reference.md)",
    "int_type": "write an integer",
    "int_parsing": "write an integer",
    "float_type": "write a number",
    "bool_type": "write true or false",
    "string_type": "write a string",
    "list_type": "write a YAML list",
    "dict_type": "write a YAML mapping",
    "model_type": "write a YAML mapping",
    "literal_error": "use one of the values listed",
    "union_tag_invalid": "use one of the stage kinds listed",
    "union_tag_not_found": "add a 'kind' field",
    "greater_than": "use a larger value",
    "too_short": "add at least one entry",
    "string_pattern_mismatch": "use letters, digits and '_' (and the form shown)",
}


@dataclass(frozen=True)
class LoadedSpec:
    spec: KernelSpec
    path: str
    positions: Positions
    text: str
    tune: tuple = ()  # (("stage.field", value), ...): overrides applied over the file (tuning sweeps)

    def comment(self, loc: tuple) -> str:
        """The ``# comment`` on the line of ``loc`` (a symbol's doc, for example)."""
        lines = self.text.splitlines()
        line = self.positions.line_of(loc)
        if not 0 < line <= len(lines):
            return ""
        _, hash_, comment = lines[line - 1].partition(" #")
        return comment.strip() if hash_ else ""

    def issue(self, loc: tuple, message: str, hint: str = "") -> SpecIssue:
        return SpecIssue(self.path, self.positions.line_of(loc), tuple(loc), message, hint)


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union-member names (e.g. 'rmsnorm_fp8', 'RoundRobin')
    that do not exist in the YAML."""
    from ..stages import KINDS

    skip = set(KINDS) | {"RoundRobin", "Fixed", "int", "str", "float", "bool", "function-after[_range(), str]"}
    return tuple(p for p in loc if not (isinstance(p, str) and (p in skip or p.startswith(("function-", "list[", "tuple[", "PerTarget")))))


def parse_spec(text: str, path: str, tune: tuple = ()) -> LoadedSpec:
    """Validate spec ``text`` read from ``path``; raise SpecError with every issue.
    ``tune``: ``("stage.field", value)`` pairs that replace those stage fields
    before validation (a knob's value for every target, or a per-target mapping),
    ``("symbols.NAME", value)`` a spec symbol's value, ``("mailbox.advance", value)`` and
    ``("grid.smem_carveout", value)`` those two fields, so that a tuning sweep needs no edit of the file; they are checked like the
    file's own values and named in the generated source's header."""
    try:
        data, pos = load(text, path)
    except YamlSyntaxError as e:
        raise SpecError([SpecIssue(e.path, e.line, (), e.message, "fix the YAML syntax at that line")]) from None
    if not isinstance(data, dict):
        raise SpecError([SpecIssue(path, pos.line_of(()), (), f"a spec must be a YAML mapping, not a {type(data).__name__}",
                                   "start with 'kernel: model/name'")])
    _apply_tune(data, tune, path, pos)
    try:
        spec = KernelSpec.model_validate(data)
    except ValidationError as e:
        issues = []
        for err in e.errors():
            loc = _clean_loc(err["loc"])
            if err["type"].startswith("union_tag_"):  # point at the tag ('kind'), not the entry
                loc += (str(err.get("ctx", {}).get("discriminator", "kind")).strip("'"),)
            msg = err["msg"].removeprefix("Value error, ")
            issues.append(SpecIssue(path, pos.line_of(loc), loc, msg, _HINTS.get(err["type"], "")))
        # a missing field is most often a misspelled one: report the misspelling first
        issues.sort(key=lambda i: i.message == "Field required")
        raise SpecError(_dedupe(issues)) from None
    issues = semantic_issues(spec, path, pos)
    if issues:
        raise SpecError(issues)
    return LoadedSpec(spec, path, pos, text, tuple(tune))


# top-level sections a tune may reach besides stages and symbols: section -> (fields, hint)
TUNABLE_SECTIONS = {
    "mailbox": (("advance",), "use mailbox.advance=last_out / count / slots"),  # how the epoch is made
    "grid": (("smem_carveout",), "use grid.smem_carveout=100 (or 0..100, -1: the driver's)"),  # the L1 / shared split
}


def _apply_tune(data: dict, tune: tuple, path: str, pos: Positions) -> None:
    stages = data.get("stages") if isinstance(data.get("stages"), list) else []
    names = [st.get("name") for st in stages if isinstance(st, dict)]
    for key, value in tune:
        value = _thaw(value)  # tune_items froze it for the cache key
        stage, dot, field = str(key).partition(".")
        if not dot or not field or "." in field:
            raise SpecError([SpecIssue(path, pos.line_of(("stages",)), ("stages",), f"tune key {key!r} is not STAGE.FIELD",
                                       "name a stage and one of its fields, e.g. qkv.bulk_copies (or symbols.NAME, mailbox.advance, "
                                       "grid.smem_carveout)")])
        if stage in TUNABLE_SECTIONS and stage not in names:  # mailbox.advance, grid.smem_carveout
            fields, hint = TUNABLE_SECTIONS[stage]
            section = data.get(stage) if isinstance(data.get(stage), dict) else {}
            if field not in fields:
                raise SpecError([SpecIssue(path, pos.line_of((stage,)), (stage,),
                                           f"tune {key!r}: a tune may set only {' / '.join(f'{stage}.{f}' for f in fields)} "
                                           f"of {stage}", hint)])
            section[field] = value
            continue
        if stage == "symbols" and stage not in names:  # symbols.NAME: a spec symbol's value
            symbols = data.get("symbols") if isinstance(data.get("symbols"), dict) else {}
            if field not in symbols:
                raise SpecError([SpecIssue(path, pos.line_of(("symbols",)), ("symbols",),
                                           f"tune {key!r}: no symbol {field!r}",
                                           f"use one of {', '.join(map(str, symbols))}")])
            symbols[field] = value
            continue
        if stage not in names:
            raise SpecError([SpecIssue(path, pos.line_of(("stages",)), ("stages",), f"tune {key!r}: no stage {stage!r}",
                                       f"use one of {', '.join(map(str, names))}, or symbols.NAME")])
        stages[names.index(stage)][field] = value


def _dedupe(issues: list[SpecIssue]) -> list[SpecIssue]:
    seen, out = set(), []
    for i in issues:
        key = (i.line, i.loc, i.message)
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


def load_spec_file(path: str | Path) -> LoadedSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError([SpecIssue(str(path), 1, (), f"cannot read spec: {e.strerror}", "check the path")]) from None
    return parse_spec(text, _display(path))


def _display(path: Path) -> str:
    """The spec's path as errors and generated headers show it: relative to the
    repository for the project's own specs (the same from any folder), else
    relative to the current folder where possible."""
    resolved = path.resolve()
    for base in (SPECS_DIR.parent, Path.cwd()):
        try:
            return str(resolved.relative_to(base))
        except ValueError:
            continue
    return str(path)


def spec_path(name: str) -> Path:
    """``minimax_m3/pre_attn`` -> specs/minimax_m3/pre_attn.yaml."""
    return SPECS_DIR / f"{name}.yaml"


def spec_names() -> list[str]:
    return sorted(str(p.relative_to(SPECS_DIR).with_suffix("")) for p in SPECS_DIR.rglob("*.yaml"))


@lru_cache(maxsize=None)
def load_spec(name: str, tune: tuple = ()) -> LoadedSpec:
    """The spec called ``name`` (cached; specs are immutable while running),
    with ``tune`` overrides (see ``parse_spec``) if any."""
    path = spec_path(name)
    if not path.exists():
        raise ValueError(f"no spec {name!r}: expected {path}; known: {', '.join(spec_names()) or 'none'}")
    if not tune:
        return load_spec_file(path)
    return parse_spec(path.read_text(), _display(path), tune)


class _Frozen(tuple):
    """A tune value's mapping (``kind`` "map": sorted (key, value) pairs) or list, frozen at
    every depth for load_spec's cache key; ``_thaw`` gives the value back."""

    def __new__(cls, kind: str, items):
        obj = super().__new__(cls, items)
        obj.kind = kind
        return obj

    def __eq__(self, other):
        return isinstance(other, _Frozen) and self.kind == other.kind and tuple.__eq__(self, other)

    def __hash__(self):
        return hash((self.kind, tuple(self)))


def _freeze(v):
    if isinstance(v, dict):
        return _Frozen("map", sorted((str(k), _freeze(x)) for k, x in v.items()))
    if isinstance(v, list):
        return _Frozen("list", (_freeze(x) for x in v))
    return v


def _thaw(v):
    if isinstance(v, _Frozen):
        return {k: _thaw(x) for k, x in v} if v.kind == "map" else [_thaw(x) for x in v]
    return v


def tune_items(tune: dict | None) -> tuple:
    """A tune mapping as load_spec's cache key: sorted (key, value) pairs, mappings and lists
    frozen at every depth."""
    return tuple(sorted((k, _freeze(v)) for k, v in (tune or {}).items()))
