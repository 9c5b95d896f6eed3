"""Malformed specs are refused with a located ``SpecError``, never anything else.

Every file in ``tests/bad_specs/`` is ``tests/specs/norm_gemv.yaml`` (a valid
two-stage spec) with one defect, ``tests/specs/attn_front.yaml`` (the
DeepSeek-V4.1 front: mxfp8_quant, key_table, gemv_mxfp8, mla_norm_rope) with
one defect (the ``ds_*`` files), or a tiny spec of its own, and starts with

    # expect: <line>: <message fragment>

The test parses it and lowers it for every target x review build (as
``python -m codegen check`` does): the first issue of the first SpecError must
name that line and contain that fragment. Any other exception type is a bug in
the checks (a crash instead of a located error)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from codegen.errors import SpecError
from codegen.lower import lower, make_build
from codegen.spec import load_spec_file
from codegen.targets import TARGETS

HERE = Path(__file__).resolve().parent
BAD = sorted((HERE / "bad_specs").glob("*.yaml"))
BASE = HERE / "specs" / "norm_gemv.yaml"
DS_BASE = HERE / "specs" / "attn_front.yaml"  # the base of the ds_* files
BASES = [BASE, DS_BASE]
# the ds_* files' prefix per DeepSeek stage kind
DEEPSEEK_KINDS = {"mxfp8_quant": "ds_mxq_", "key_table": "ds_kt_", "gemv_mxfp8": "ds_gemv_", "mla_norm_rope": "ds_mla_"}
HEADER = re.compile(r"^# expect: (\d+): (.+)$")


def first_issue(path: Path):
    """The first issue of the first SpecError from parsing, then lowering every
    target x review build; None if the spec is accepted everywhere."""
    try:
        loaded = load_spec_file(path)
    except SpecError as e:
        return e.issues[0]
    for target in TARGETS:
        for values in loaded.spec.review_builds or [{}]:
            try:
                lower(loaded, make_build(loaded, target, **values))
            except SpecError as e:
                return e.issues[0]
    return None


def expectation(path: Path) -> tuple[int, str]:
    first = path.read_text(errors="replace").splitlines()[0]
    m = HEADER.match(first)
    assert m, f"{path.name}: first line must be '# expect: <line>: <message fragment>', got {first!r}"
    return int(m[1]), m[2]


@pytest.mark.parametrize("base", BASES, ids=lambda p: p.stem)
def test_base_spec_is_valid(base):
    """The bases of the bad specs parse and lower everywhere: each bad spec's
    defect is its only one."""
    assert first_issue(base) is None


def test_deepseek_stage_kinds_have_bad_specs():
    """At least two defects for each DeepSeek stage kind: a defect in what a
    stage of that kind binds (ABI arguments, regions, fields, sources)."""
    for kind, prefix in DEEPSEEK_KINDS.items():
        assert len([p for p in BAD if p.name.startswith(prefix)]) >= 2, kind


def test_bad_specs_are_many_and_distinct():
    assert len(BAD) >= 40
    texts = [p.read_text(errors="replace") for p in BAD]
    assert len(set(texts)) == len(texts)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_spec_is_refused_at_its_line(path):
    line, fragment = expectation(path)
    issue = first_issue(path)  # any exception but SpecError fails the test here
    assert issue is not None, f"{path.name}: accepted, expected line {line}: {fragment}"
    assert issue.line >= 1
    text = str(issue)
    assert text.startswith(f"{issue.file}:{issue.line}: "), text
    assert issue.file.endswith(f"bad_specs/{path.name}"), issue.file
    assert (issue.line, fragment in issue.message) == (line, True), f"expected {line}: {fragment!r}, got {text}"
