"""Located spec errors: ``file:line: field.path: message`` plus how to fix it.

Every problem found in a spec, by the YAML parser, the pydantic models, the
semantic checks or the lowering, becomes a ``SpecIssue`` with the path of the
offending field; ``SpecError`` carries all of them and prints one per line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecIssue:
    file: str
    line: int
    loc: tuple
    message: str
    hint: str = ""

    def __str__(self) -> str:
        field = ".".join(str(p) for p in self.loc) or "<spec>"
        text = f"{self.file}:{self.line}: {field}: {self.message}"
        return f"{text}\n    fix: {self.hint}" if self.hint else text


class SpecError(ValueError):
    """One or more located problems in a spec file."""

    def __init__(self, issues: list[SpecIssue]):
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))
