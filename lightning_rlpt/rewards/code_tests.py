"""The two test formats of `CodeExecutionReward`'s rows, and how stdin/stdout outputs compare.

- **assert-style**: a list of Python snippets (MBPP's ``test_list``:
  ``["assert add(1, 2) == 3", ...]``), or one string (HumanEval's ``check(candidate)`` program).
- **stdin/stdout** (competitive programming; APPS, TACO, CodeContests): a dict
  ``{"inputs": [...], "outputs": [...]}`` of strings, or a list of ``{"input": ..., "output": ...}``
  dicts. The program runs once per input; its standard output is compared with the expected
  output in the trainer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMPARE = ("lines", "exact")


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

    Example:
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


def _cases(inputs, outputs) -> StdioCases | None:
    if not inputs or len(inputs) != len(outputs) or not all(isinstance(s, str) for s in (*inputs, *outputs)):
        return None
    return StdioCases(tuple(inputs), tuple(outputs))


def same_output(got: str, expected: str, compare: str = "lines") -> bool:
    """Whether a program's output matches: ``"exact"`` byte for byte, or ``"lines"`` (the
    default): line by line, ignoring trailing whitespace on each line, trailing blank lines and
    ``\\r\\n`` vs ``\\n``.

    Example:
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
