"""docs/ and the README: the spec reference is what
``codegen.docs.spec_reference`` generates from the models, and every file,
test and ``codegen.*`` name the docs cite in backticks exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from codegen.__main__ import main
from codegen.docs import SPEC_REFERENCE, spec_reference

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
TOP_DIRS = ("codegen/", "templates/", "specs/", "tests/", "docs/", "generated/", "scripts/", "bench/")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
PLACEHOLDER = re.compile(r"[<>*{}]|\.\.\.")


def test_spec_reference_is_current():
    assert SPEC_REFERENCE.exists(), "docs/spec-reference.md missing: run python -m codegen docs"
    assert SPEC_REFERENCE.read_text() == spec_reference(), "docs/spec-reference.md is stale: run python -m codegen docs"


def test_field_descriptions_from_comments():
    """A field's description is the comment on its line, else the comment lines right above
    it (joined); a blank line or code above ends that note."""
    from codegen.docs import _comments

    class Sample:
        # one note
        # in two lines
        a: int = 1
        b: int = 2  # its own line's
        # above b's neighbour, but this one has its own
        c: int = 3  # own wins

        d: int = 4

    notes = _comments(Sample)
    assert notes == {"a": "one note in two lines", "b": "its own line's", "c": "own wins"}
    text = spec_reference()
    assert "| tensor-core dots: a CTA of n items gives each the fewest warps" in text  # index_scores.busy_waves
    assert "| the stage CTA that takes work item 0 |" in text  # lead_cta: its own line's


def test_spec_reference_covers_every_kind_and_field():
    from codegen.spec.kernel import KernelSpec
    from codegen.stages import KINDS

    text = spec_reference()
    for kind, mod in KINDS.items():
        assert f"\n### {kind}\n" in text
        for name in mod.Model.model_fields:
            assert f"| `{name}` |" in text
    for name in KernelSpec.model_fields:
        assert f"| `{name}` |" in text


def test_docs_command(tmp_path, monkeypatch, capsys):
    import codegen.docs

    target = tmp_path / "spec-reference.md"
    monkeypatch.setattr(codegen.docs, "SPEC_REFERENCE", target)
    assert main(["docs", "--check"]) == 1
    assert "stale" in capsys.readouterr().out
    assert main(["docs"]) == 0
    assert target.read_text() == spec_reference()
    assert main(["docs"]) == 0
    assert "up to date" in capsys.readouterr().out.splitlines()[-1]
    assert main(["docs", "--check"]) == 0


def cited(text: str) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """(repository paths, codegen.* names, (test file, test name)) cited in code spans."""
    paths, names, tests = set(), set(), set()
    for m in CODE_SPAN.finditer(text):
        span = m.group(2).strip()
        if " " in span or PLACEHOLDER.search(span):
            continue
        if "::" in span and span.startswith("tests/"):
            path, _, name = span.partition("::")
            tests.add((path, name))
        elif span.startswith(TOP_DIRS) or span in ("Makefile", "pyproject.toml"):
            paths.add(span.split(":")[0])
        elif re.fullmatch(r"codegen(\.\w+)+(\(\))?", span):
            names.add(span.removesuffix("()"))
    return paths, names, tests


def resolve(dotted: str):
    """Import the longest module prefix of ``dotted``, then walk attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_cited_code_exists(doc):
    paths, names, tests = cited(doc.read_text())
    assert paths or names or tests or doc == SPEC_REFERENCE
    missing = [p for p in sorted(paths) if not (ROOT / p).exists()]
    assert not missing, f"{doc.name} cites files that do not exist: {missing}"
    for name in sorted(names):
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            pytest.fail(f"{doc.name} cites {name}, which does not resolve: {e}")
    for path, name in sorted(tests):
        text = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        assert re.search(rf"^def {re.escape(name)}\b", text, re.M), f"{doc.name} cites {path}::{name}, not found"


def test_the_checker_sees_through_a_bad_citation():
    paths, names, tests = cited("see `codegen/nothing.py`, `codegen.review.nope`, `tests/test_docs.py::test_x`, "
                                "`generated/<model>/x.hip` and ``codegen.docs.spec_reference``")
    assert paths == {"codegen/nothing.py"} and names == {"codegen.review.nope", "codegen.docs.spec_reference"}
    assert tests == {("tests/test_docs.py", "test_x")}
    with pytest.raises(AttributeError):
        resolve("codegen.review.nope")
    assert callable(resolve("codegen.docs.spec_reference"))
