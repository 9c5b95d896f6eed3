"""codegen.expr: the spec's small expressions, and what they refuse."""

import pytest

from codegen.expr import ExprError, evaluate, names

SCOPE = {"tokens": 5, "tp": 2, "HEAD_DIM": 128}


@pytest.mark.parametrize("text, value", [
    ("HEAD_DIM // 16", 8),
    ("min(tokens, 16) * 3", 15),
    ("ceil_div(tokens, 4)", 2),
    ("2 <= tokens <= 5", True),
    ("2 <= tokens < 5", False),
    ("tokens in (2, 3, 5)", True),
    ("tokens in (2, 3)", False),
    ("tokens not in (2, 3)", True),
    ("tokens not in (5,)", False),
    ("tokens in (tp + 3, 9)", True),  # the listed values are expressions too
    ("1 + (tp == 4 and 7 <= tokens <= 10) + (tp == 2 and tokens in (3, 5, 11))", 2),  # QX8_COPIES' rule
    ("1 + (tp == 4 and 7 <= tokens <= 10) + (tp == 4 and tokens in (3, 5, 11))", 1),
])
def test_evaluate(text, value):
    got = evaluate(text, SCOPE)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text, message", [
    ("tokens in HEAD_DIM", "unsupported syntax"),        # membership of a name: not a value list
    ("tokens in range(9)", "unsupported syntax"),
    ("tokens in ()", "unsupported syntax"),
    ("tokens in (2, 3) == 1", "unsupported syntax"),     # part of a chain
    ("(2, 3)", "unsupported syntax"),                    # a list is no value
    ("tokens is 5", "unsupported syntax"),
    ("tokens in (2, width)", "unknown symbol 'width'"),
])
def test_refused(text, message):
    with pytest.raises(ExprError, match=message):
        evaluate(text, SCOPE)


def test_names_of_a_value_list():
    assert names("tp == 2 and tokens in (2, HEAD_DIM // 64)") == {"tp", "tokens", "HEAD_DIM"}
