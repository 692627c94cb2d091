"""What `RemoteCodeReward` reads from a row and a completion: the test cases (checked before
anything runs) and the code block for a language (``sandbox_names`` says which names a test
asks of the candidate)."""
from __future__ import annotations

import json
from typing import Any

from ..calling import RewardError
from .reward import FENCE  # the same fenced-block pattern as the local code reward
from .formats import StdioCases, parse_row, refuse_idle_tests

FORMS = ("a list of assert-style Python snippets (or one string), or stdin/stdout cases of strings, as many "
         'inputs as outputs: {"inputs": [...], "outputs": [...]}, [{"input": ..., "output": ...}, ...] or '
         '{"test_cases": [...]}')
LABELS = {"cpp": ("cpp", "c++"), "nodejs": ("javascript", "js", "nodejs"), "typescript": ("typescript", "ts"),
          "go": ("go", "golang"), "rust": ("rust", "rs"), "bash": ("bash", "sh", "shell"), "csharp": ("csharp", "cs")}


def read_tests(row: Any, test_format: str, where: str) -> tuple:
    """A row's tests, in `CodeExecutionReward`'s formats (`code_tests.parse_row`) plus open-r1's
    ``{"test_cases": [...]}`` and, with ``test_format="stdio"``, the same as a JSON string:
    assert-style snippets (strings, each checked to compile), or ``(input, output)`` pairs.

    Args:
        row: the column's value for one sample.
        test_format: ``"auto"``, ``"assert"`` or ``"stdio"``.
        where: names the row in errors.

    Examples:
        >>> read_tests({"inputs": ["1 2\\n"], "outputs": ["3\\n"]}, "auto", "row 0")
        (('1 2\\n', '3\\n'),)
        >>> read_tests("assert f(1) == 2", "auto", "row 0")
        ('assert f(1) == 2',)
    """
    if test_format == "stdio" and isinstance(row, str):
        try:
            row = json.loads(row)
        except ValueError as err:
            raise RewardError(f"{where} is not JSON ({err}): {row[:80]!r}; test_format='stdio' needs {FORMS}") from err
    if isinstance(row, dict) and "fn_name" in row:
        raise RewardError(f"{where} is a call-based test (fn_name={row['fn_name']!r}); RemoteCodeReward runs "
                          "stdin/stdout cases, or assert-style snippets that call the function")
    if isinstance(row, dict) and "test_cases" in row:
        row = row["test_cases"]
    tests = parse_row(row)
    stdio = isinstance(tests, StdioCases)
    if tests is None or (test_format == "assert" and stdio) or (test_format == "stdio" and not stdio):
        raise RewardError(f"{where} is {str(row)[:80]!r}, which is not a test row for test_format={test_format!r}: "
                          f"give {FORMS}")
    if stdio:
        return tuple(zip(tests.inputs, tests.outputs))
    for snippet in tests:
        try:
            compile(snippet, "<test>", "exec")
        except (SyntaxError, ValueError) as err:
            raise RewardError(f"{where} has a test that is not valid Python ({err}): {snippet[:80]!r}; fix the "
                              "dataset, or pass test_format='stdio' if these are stdin/stdout cases") from err
    refuse_idle_tests(tests, where, RewardError)
    return tests


def block_for(text: str, language: str) -> str:
    """The last fenced block of ``text`` labelled for ``language`` (or unlabelled), else the text.

    Examples:
        >>> block_for("```cpp\\nint main() {}\\n```", "cpp")
        'int main() {}\\n'
    """
    labels = ("", language.lower(), *LABELS.get(language, ()))
    blocks = [body for label, body in FENCE.findall(text) if label.lower() in labels]
    return blocks[-1] if blocks else text
