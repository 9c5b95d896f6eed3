"""YAML loading that remembers where every value came from.

``load(text, path)`` returns plain Python data (dicts, lists, scalars) and a
``Positions`` map from a value's path (a tuple of keys and list indices, the
same shape as a pydantic error's ``loc``) to its 1-based line. Spec errors are
reported as ``file:line: field.path: message``; this is where the line comes
from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class Positions:
    """Line of each value (and of each mapping key) by its path."""

    path: str
    lines: dict[tuple, int] = field(default_factory=dict)

    def line_of(self, loc: tuple) -> int:
        """The line of ``loc``, or of its nearest ancestor that has one."""
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), 1)


class YamlSyntaxError(ValueError):
    """Malformed YAML, located."""

    def __init__(self, path: str, line: int, message: str):
        self.path, self.line, self.message = path, line, message
        super().__init__(f"{path}:{line}: {message}")


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (a silent overwrite hides typos)."""


def _build(node: yaml.Node, loc: tuple, pos: Positions) -> Any:
    pos.lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            key = _Loader.construct_object(_Loader(""), key_node)  # scalars only
            if key in out:
                raise YamlSyntaxError(
                    pos.path,
                    key_node.start_mark.line + 1,
                    f"duplicate key {key!r} (first at line {pos.lines[loc + (key,)]}); "
                    "remove one of them",
                )
            out[key] = _build(value_node, loc + (key,), pos)
            # a key's own line wins over its value's (a block value starts below)
            pos.lines[loc + (key,)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(child, loc + (i,), pos) for i, child in enumerate(node.value)]
    return _Loader("").construct_object(node)


def load(text: str, path: str | Path = "<string>") -> tuple[Any, Positions]:
    """Parse ``text`` (the content of ``path``) into data and positions."""
    pos = Positions(str(path))
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise YamlSyntaxError(str(path), line, f"YAML syntax: {e.problem or e}") from None
    if node is None:
        return {}, pos
    return _build(node, (), pos), pos
