"""Checks of every prompt row at load time: text files that are not UTF-8, rows whose columns
differ from the others' (a missing or misspelt key), prompts that are neither a string nor a
list of messages. Each error names the file (or dataset), the row and the fix.

Why every row: ``datasets`` gives a JSON row that lacks a key None in that column, and a
reward function then scores it silently wrong; a list row without a key fails later with a
bare ``KeyError``; a None prompt fails inside tokenization with ``'NoneType' object is not
iterable``.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

MESSAGE_FORM = "a string, or a list of {'role', 'content'} messages"


def read_utf8(path: str) -> str:
    """The file's text; a byte sequence that is not UTF-8 is a ValueError naming the file and line.

    Examples:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        ...     _ = f.write(b'{"prompt": "caf\\xe9"}\\n')
        >>> read_utf8(f.name)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: ... is not UTF-8 text: line 1 (byte 15) has 0xe9 (invalid continuation byte). ...
        >>> import os; os.remove(f.name)
    """
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8-sig")  # a leading byte-order mark is UTF-8 too
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ValueError(f"{path!r} is not UTF-8 text: line {line} (byte {err.start}) has 0x{raw[err.start]:02x} "
                         f"({err.reason}). Save it as UTF-8, e.g. `iconv -f latin1 -t utf-8 in > out` for a Latin-1 "
                         "file") from None


def json_row_keys(path: str, text: str) -> tuple[list[Sequence[str]], list[int] | None]:
    """The keys of each row of a JSON-lines file (or of a .json file holding a list of rows) and
    each row's line number (None for a .json list). Other .json layouts give no rows: ``datasets``
    decides what they mean. A line that is not JSON is a ValueError naming it."""
    if path.endswith(".json"):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None  # JSON lines in a .json file, which `datasets` reads too
        if doc is not None:
            rows = doc if isinstance(doc, list) else []
            _refuse_non_objects(path, [(f"item {i} of its list", row) for i, row in enumerate(rows)])
            return [list(r) for r in rows], None
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:  # one parse of all lines is 3x faster than a parse per line; the slow path finds a bad line
        rows = json.loads("[" + ",".join(line for _, line in numbered) + "]")
    except ValueError:
        rows = [_parse_line(path, n, line) for n, line in numbered]
    _refuse_non_objects(path, [(f"line {n}", row) for (n, _), row in zip(numbered, rows)])
    return [list(row) for row in rows], [n for n, _ in numbered]


def _refuse_non_objects(path: str, rows: list[tuple[str, Any]]) -> None:
    """A row is a JSON object; another JSON value (``[1, 2]``, ``"text"``) is refused naming where it
    is (``datasets`` fails on it without saying where, or drops it)."""
    for where, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{where} of {path!r} is valid JSON but not an object: {_short(row)} ({_kind(row)}). "
                             "Each row is one object of columns, e.g. {\"prompt\": \"1+1=\", \"answer\": \"2\"}: "
                             "fix or remove that row")


def _parse_line(path: str, n: int, line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as err:
        raise ValueError(f"line {n} of {path!r} is not a JSON object ({err}): {line[:80]!r}. Each line of a "
                         "JSON-lines file holds one row, e.g. {\"prompt\": \"1+1=\", \"answer\": \"2\"}") from None


def check_same_columns(keys: list[Sequence[str]], where: str, lines: list[int] | None = None) -> None:
    """Every row has every column that any row has; else a ValueError naming the column, a row
    without it and a row with it (a misspelt key shows as one column missing, another extra).

    Args:
        keys: each row's column names.
        where: the file or dataset, for the message.
        lines: each row's line in the file, when it has lines.

    Examples:
        >>> check_same_columns([["prompt", "answer"], ["prompt", "anwser"]], "rows.jsonl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: rows.jsonl: column 'answer' is missing from 1 of 2 rows (first: row 1, whose columns are ...
    """
    if len(set(map(frozenset, keys))) <= 1:  # the common case, in one pass
        return
    columns = list(dict.fromkeys(k for row in keys for k in row))
    rows = [set(row) for row in keys]
    for column in columns:
        lacking = [i for i, row in enumerate(rows) if column not in row]
        if lacking:
            i, j = lacking[0], next(j for j, row in enumerate(rows) if column in row)
            raise ValueError(
                f"{where}: column {column!r} is missing from {len(lacking)} of {len(rows)} rows (first: "
                f"{_row(i, lines)}, whose columns are {list(keys[i])}; {_row(j, lines)} has it). Every row needs "
                "every column (a missing one would reach reward functions as None and score the row silently "
                "wrong): correct a misspelt key, or give the column to every row (null where it does not apply)")


def check_prompts(prompts: Sequence[Any], column: str, where: str) -> None:
    """Every prompt is a string or a non-empty list of message dicts; else a ValueError naming
    the first bad row and what it holds.

    Examples:
        >>> check_prompts(["1+1=", None], "prompt", "training dataset")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: training dataset: row 1 has None (a NoneType) in its prompt column 'prompt'; ...
    """
    for i, prompt in enumerate(prompts):
        if not _is_prompt(prompt):
            raise ValueError(f"{where}: row {i} has {_short(prompt)} ({_kind(prompt)}) in its prompt column "
                             f"{column!r}; a prompt is {MESSAGE_FORM}. Fix or drop that row (or point prompt_column= / "
                             "columns= at the column that holds the prompts)")


def _is_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(
        isinstance(m, dict) and "role" in m for m in prompt)


def _kind(value: Any) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _row(i: int, lines: list[int] | None) -> str:
    return f"row {i}" + (f" (line {lines[i]})" if lines else "")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
