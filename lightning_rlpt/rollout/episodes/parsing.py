"""Tool calls parsed out of a model turn: the `ToolCall` record, the parser protocol and the
default `HermesToolParser` (Qwen2.5/Qwen3/Hermes chat templates).

A parser never raises for the model's mistakes: a call it cannot read becomes an entry in
`ParsedTurn.errors`, which the episode loop feeds back to the model as a failed tool message
(and counts in ``tools/failure_frequency``), so the model learns the format instead of the run
crashing. That includes JSON Python itself refuses: an integer past its 4,300-digit limit
(``ValueError``) and nesting past the recursion limit (``RecursionError``).
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Union, runtime_checkable

MAX_DEPTH = 100  # nesting levels a tool argument may have (`tools.check_arguments`): far from the recursion limit


@dataclass
class ToolCall:
    """One call the model asked for.

    Args:
        name: the tool's name as the model wrote it (not yet checked against the tools).
        arguments: the call's keyword arguments (JSON object).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParsedTurn:
    """What a parser found in one model turn.

    Args:
        calls: the well-formed calls, in the order written.
        errors: one message per call that could not be read, saying what was wrong.
    """

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def has_calls(self) -> bool:
        """True when the turn asked for anything (a call or an unreadable attempt): the episode
        then continues with tool messages instead of ending."""
        return bool(self.calls or self.errors)


@runtime_checkable
class ToolParser(Protocol):
    """Anything with ``parse(text) -> ParsedTurn``."""

    def parse(self, text: str) -> ParsedTurn: ...


ParserLike = Union[ToolParser, Callable[[str], ParsedTurn]]


class HermesToolParser:
    """Reads ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, the format of
    the Hermes and Qwen2.5/Qwen3 chat templates. Several calls per turn are allowed.

    An unclosed ``<tool_call>`` (the turn stopped mid-call) is an error, as are JSON that does
    not parse (a 5,000-digit integer and 1,000-deep nesting included), a value that is not an object, a missing or non-string ``name``, and
    ``arguments`` that are not an object. ``arguments`` given as a JSON *string* holding an
    object (some models write that) is accepted and decoded.

    Args:
        start: the opening tag.
        end: the closing tag.

    Examples:
        >>> turn = HermesToolParser().parse('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
        >>> turn.calls, turn.errors
        ([ToolCall(name='add', arguments={'a': 1})], [])
        >>> HermesToolParser().parse('<tool_call>{"name": add}</tool_call>').errors[0][:37]
        'tool call 1 is not valid JSON (Expect'
    """

    def __init__(self, start: str = "<tool_call>", end: str = "</tool_call>"):
        self.start, self.end = start, end
        self._block = re.compile(re.escape(start) + r"(.*?)(" + re.escape(end) + r"|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        turn = ParsedTurn()
        for i, match in enumerate(self._block.finditer(text), start=1):
            body, closed = match.group(1), bool(match.group(2))
            if not closed:
                turn.errors.append(f"tool call {i} has no closing {self.end}; write "
                                   f'{self.start}{{"name": ..., "arguments": {{...}}}}{self.end}')
                continue
            call = self._decode(body.strip(), i)
            if isinstance(call, str):
                turn.errors.append(call)
            else:
                turn.calls.append(call)
        return turn

    def _decode(self, body: str, i: int) -> ToolCall | str:
        """The call in one block, or the error message (a string) saying what was wrong."""
        fmt = f'write {self.start}{{"name": "<tool>", "arguments": {{...}}}}{self.end}'
        value, problem = loads(body)
        if problem:
            return f"tool call {i} {problem}; {fmt}"
        if not isinstance(value, dict):
            return f"tool call {i} is a JSON {type(value).__name__}, not an object; {fmt}"
        name, arguments = value.get("name"), value.get("arguments", {})
        if not isinstance(name, str) or not name:
            return f'tool call {i} has no "name" string; {fmt}'
        if isinstance(arguments, str):  # some models JSON-encode the arguments twice
            decoded, problem = loads(arguments)
            if problem:
                return f'tool call {i} ({name[:50]}): "arguments" is a string that {problem}; {fmt}'
            arguments = decoded if isinstance(decoded, dict) else arguments
        if not isinstance(arguments, dict):
            return (f'tool call {i} ({name[:50]}): "arguments" must be a JSON object, got {type(arguments).__name__}; '
                    f"{fmt}")
        return ToolCall(name, arguments)


def loads(text: str) -> tuple[Any, str | None]:
    """``(json.loads(text), None)``, or ``(None, what was wrong)`` for text the model wrote:
    invalid JSON, an integer past Python's digit limit (``ValueError``), nesting past the
    recursion limit (``RecursionError``). Never raises.

    Text nested more than ``MAX_DEPTH + 2`` levels (a call object, its arguments, then at most
    ``MAX_DEPTH`` levels of an argument, as `tools.check_arguments` accepts) is refused before
    ``json.loads``: whether the recursion limit is reached depends on ``sys.getrecursionlimit()``,
    which libraries raise, so the answer would depend on what else the process imported.

    Examples:
        >>> loads('{"a": 1}'), loads("[" * 100_000)[1], loads("[" * 103 + "]" * 103)[1]
        (({'a': 1}, None), 'is nested too deeply to read (nest at most 100 levels)', 'is nested too deeply to read (nest at most 100 levels)')
    """
    # The bracket count first (C speed): the character scan runs only on text that could be too deep.
    if text.count("[") + text.count("{") > MAX_DEPTH + 2 and nesting_depth(text) > MAX_DEPTH + 2:
        return None, f"is nested too deeply to read (nest at most {MAX_DEPTH} levels)"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"is not valid JSON ({err})"
    except ValueError:  # int(...) of more digits than sys.get_int_max_str_digits()
        return None, (f"has an integer of more than {sys.get_int_max_str_digits()} digits, which cannot be read "
                      "(write it as a string)")
    except RecursionError:
        return None, f"is nested too deeply to read (nest at most {MAX_DEPTH} levels)"


def nesting_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON ``text``, brackets inside strings not counted.

    Examples:
        >>> nesting_depth('{"a": [[1], "]]]["], "b": {}}')
        3
    """
    depth = peak = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            peak = max(peak, depth)
        elif ch in "]}":
            depth -= 1
    return peak


def as_parser(parser: ParserLike | None) -> ToolParser:
    """The parser to use: `HermesToolParser` for None, the object itself when it has
    ``parse``, a wrapper for a plain callable ``text -> ParsedTurn``.

    Args:
        parser: None, an object with ``parse(text)``, or a callable.

    Examples:
        >>> as_parser(None).__class__.__name__
        'HermesToolParser'
        >>> as_parser(lambda text: ParsedTurn()).parse("hi")
        ParsedTurn(calls=[], errors=[])
    """
    if parser is None:
        return HermesToolParser()
    if isinstance(parser, type):
        raise TypeError(f"tool_parser is the class {parser.__name__}; pass an instance, e.g. {parser.__name__}()")
    if hasattr(parser, "parse"):
        return parser  # type: ignore[return-value]
    if callable(parser):
        return _CallableParser(parser)
    raise TypeError(f"tool_parser must have a parse(text) method or be a callable text -> ParsedTurn, "
                    f"got {type(parser).__name__}")


class _CallableParser:
    def __init__(self, fn: Callable[[str], ParsedTurn]):
        self.fn = fn

    def parse(self, text: str) -> ParsedTurn:
        turn = self.fn(text)
        if not isinstance(turn, ParsedTurn):
            raise TypeError(f"tool_parser {getattr(self.fn, '__name__', self.fn)!r} returned "
                            f"{type(turn).__name__}; it must return a ParsedTurn(calls, errors)")
        return turn
