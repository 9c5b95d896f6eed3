"""Property tests: whatever a spec file holds, loading and lowering it either
succeeds or raises a located ``SpecError``; never another exception.

Two mutators of the real spec (specs/minimax_m3/pre_attn.yaml): on its data
(delete a key or entry, replace a value with a random scalar / list / mapping,
rename a key, duplicate a list entry; then dump to YAML) and on its raw text
(insert and delete characters). Every issue must carry a line >= 1 and print
as ``<file>:<line>: ``. Bounded to ~200 examples each (a few seconds)."""

from __future__ import annotations

import copy

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from codegen.errors import SpecError  # noqa: E402
from codegen.lower import lower, make_build  # noqa: E402
from codegen.spec import parse_spec  # noqa: E402
from codegen.spec.load import spec_path  # noqa: E402
from codegen.targets import TARGETS  # noqa: E402

TEXT = spec_path("minimax_m3/pre_attn").read_text()
DATA = yaml.safe_load(TEXT)
FILE = "mutant.yaml"
SETTINGS = settings(max_examples=200, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _paths(node, prefix=()):
    """Every path (keys and indices) into the spec's data, the root excluded."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,))
    return out


PATHS = _paths(DATA)
# names and expressions of the spec itself: mutants that are nearly right reach the deep checks
WORDS = sorted({str(k) for p in PATHS for k in p if isinstance(k, str)} | {
    "tokens", "QKV_ROWS // 16", "tokens > 2", "tokens in (2, 3)", "tokens in x", "HIDDEN", "1 // 0", "2 ** 99", "min()", "(", "x8s", "qkv", "norm",
    "-1", "0", "1..0", "gfx942", "sm90", "pairs", "words", "fp8", "i32", "inout", "scratch", "step"})

# any character but surrogates, no codec: st.text()'s default utf-8 codec warns (in some test
# orders) that a space does not round-trip
CHARS = st.characters()
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.sampled_from([0, 1, -1, 16, 17, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(CHARS, max_size=12), st.sampled_from(WORDS),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.one_of(st.sampled_from(WORDS), st.text(CHARS, max_size=6)), scalars, max_size=3),
)


def _parent(data, path):
    node = data
    for k in path[:-1]:
        node = node[k]
    return node


def _mutate(data, op: str, path: tuple, value, new_key) -> None:
    try:
        parent = _parent(data, path)
    except (KeyError, IndexError, TypeError):  # an earlier mutation removed or replaced the path
        return
    key = path[-1]
    if isinstance(parent, dict) and key not in parent or isinstance(parent, list) and not (
            isinstance(key, int) and key < len(parent)) or not isinstance(parent, (dict, list)):
        return
    if op == "delete":
        del parent[key]
    elif op == "replace":
        parent[key] = value
    elif op == "rename" and isinstance(parent, dict):
        v = parent.pop(key)
        parent[new_key] = v
    elif op == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))


mutations = st.lists(
    st.tuples(st.sampled_from(["delete", "replace", "rename", "duplicate"]), st.sampled_from(PATHS), values,
              st.one_of(st.sampled_from(WORDS), st.text(CHARS, max_size=8), st.integers(-3, 3))),
    min_size=1, max_size=3,
)


def check_text(text: str, pick: int | None = None) -> None:
    """Parse ``text`` and lower it for every target x review build (or only
    the ``pick``-th of them, to keep examples cheap): it is accepted or refused
    with located issues, nothing else."""
    try:
        loaded = parse_spec(text, FILE)
        builds = [(t, b) for t in TARGETS for b in loaded.spec.review_builds or [{}]]
        for target, build in builds if pick is None else [builds[pick % len(builds)]]:
            lower(loaded, make_build(loaded, target, **build))
    except SpecError as e:
        assert e.issues, "a SpecError without issues"
        for issue in e.issues:
            assert isinstance(issue.line, int) and issue.line >= 1, issue
            assert str(issue).startswith(f"{FILE}:{issue.line}: "), str(issue)


def test_real_spec_passes_the_check():
    check_text(TEXT)


@SETTINGS
@given(mutations, st.integers(0, 63))
def test_data_mutations_fail_only_with_located_errors(muts, pick):
    data = copy.deepcopy(DATA)
    for op, path, value, new_key in muts:
        _mutate(data, op, path, value, new_key)
    check_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), pick)


edits = st.lists(
    st.tuples(
        st.sampled_from(["insert", "delete"]),
        st.integers(0, len(TEXT)),
        st.one_of(st.sampled_from(list(":-[]{}#&*!|>'\"%@`,? \t\n0123456789._")), st.characters()),
        st.integers(1, 8),
    ),
    min_size=1, max_size=4,
)


@SETTINGS
@given(edits, st.integers(0, 63))
def test_text_mutations_fail_only_with_located_errors(ops, pick):
    text = TEXT
    for op, at, char, n in ops:
        at = min(at, len(text))
        text = text[:at] + char * n + text[at:] if op == "insert" else text[:at] + text[at + n:]
    check_text(text, pick)
