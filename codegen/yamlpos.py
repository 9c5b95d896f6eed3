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
    nodes: int = 0  # values built so far (a bound on alias expansion)

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


# libyaml's parser where PyYAML has it (about 15x faster than the pure-Python one):
# it only builds the node tree; values are still constructed by SafeLoader below
_COMPOSER = getattr(yaml, "CSafeLoader", None) or _Loader


MAX_NODES = 100_000  # a spec has a few hundred values: more is an alias bomb


def _build(node: yaml.Node, loc: tuple, pos: Positions, stack: tuple = ()) -> Any:
    line = node.start_mark.line + 1
    if id(node) in stack:  # an alias to an enclosing node: infinitely deep data
        raise YamlSyntaxError(pos.path, line, "recursive alias: a value contains itself")
    pos.nodes += 1
    if pos.nodes > MAX_NODES:
        raise YamlSyntaxError(pos.path, line, f"more than {MAX_NODES} values (aliases expanding without bound?)")
    pos.lines[loc] = line
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlSyntaxError(pos.path, key_node.start_mark.line + 1,
                                      "a mapping key must be a plain scalar, not a list or a mapping")
            key = _construct(key_node, pos)
            if key in out:
                raise YamlSyntaxError(
                    pos.path,
                    key_node.start_mark.line + 1,
                    f"duplicate key {key!r} (first at line {pos.lines[loc + (key,)]}); "
                    "remove one of them",
                )
            out[key] = _build(value_node, loc + (key,), pos, stack + (id(node),))
            # a key's own line wins over its value's (a block value starts below)
            pos.lines[loc + (key,)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(child, loc + (i,), pos, stack + (id(node),)) for i, child in enumerate(node.value)]
    return _construct(node, pos)


def _construct(node: yaml.Node, pos: Positions) -> Any:
    """A scalar's value (safe tags only); a bad tag or value is a located error."""
    try:
        value = _Loader("").construct_object(node)
    except yaml.MarkedYAMLError as e:
        raise YamlSyntaxError(pos.path, node.start_mark.line + 1, f"YAML: {e.problem or e}") from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. '!!int abc', '!!binary' that is not base64
        raise YamlSyntaxError(pos.path, node.start_mark.line + 1, f"YAML: bad {node.tag} value {node.value!r}: {e}") from None
    try:
        hash(value)
    except TypeError:  # a tagged scalar that constructs to a list or a mapping ('!!set', '!!omap')
        raise YamlSyntaxError(pos.path, node.start_mark.line + 1, f"YAML: unsupported tag {node.tag}") from None
    return value


def load(text: str, path: str | Path = "<string>") -> tuple[Any, Positions]:
    """Parse ``text`` (the content of ``path``) into data and positions."""
    pos = Positions(str(path))
    try:
        node = yaml.compose(text, Loader=_COMPOSER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or str(e)
        if e.context_mark is not None and "end of stream" in problem:  # an unclosed quote or bracket:
            mark, problem = e.context_mark, f"{e.context} never closed ({problem})"  # where it opened
        line = mark.line + 1 if mark else 1
        raise YamlSyntaxError(str(path), line, f"YAML syntax: {problem}") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (control characters)
        before = text.encode("utf-8", "surrogatepass")[: max(e.position, 0)] if _COMPOSER is not _Loader \
            else text[: max(e.position, 0)]  # libyaml counts bytes, PyYAML characters
        line = before.count(b"\n" if isinstance(before, bytes) else "\n") + 1
        code = e.character if isinstance(e.character, int) else ord(e.character[:1] or "\0")
        raise YamlSyntaxError(str(path), line, f"YAML syntax: character #x{code:02x} is not allowed") from None
    except RecursionError:
        raise YamlSyntaxError(str(path), 1, "YAML syntax: nested too deeply") from None
    if node is None:
        return {}, pos
    try:
        return _build(node, (), pos), pos
    except RecursionError:
        raise YamlSyntaxError(str(path), 1, "YAML: nested too deeply") from None
