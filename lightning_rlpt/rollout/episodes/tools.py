"""Tools the model may call during an episode: `Tool` (a Python function and its JSON schema)
and `ToolBox` (the tools of a run, which executes calls under a time limit).

The schema comes from transformers' own `get_json_schema`, so it is exactly what the chat
template's ``tools=`` argument expects; a function it cannot describe (no type hints, no
docstring, an argument without a description) is refused when the run is built, naming the
tool. After that `ToolBox.call` never raises for the model's mistakes: every failure becomes a
`ToolResult` with ``failed=True`` and a content starting ``"error: "`` that tells the model
what was wrong, so it can learn from it (and ``tools/failure_frequency`` counts it).

What a tool returns: a ``str`` is used as is; any other JSON-serialisable value (int, float,
bool, None, list, dict) is sent as ``json.dumps(value)`` (so ``42`` reads ``42``, ``None``
reads ``null``); anything else (an object, bytes, a set, NaN) is a failed call, because its
``repr`` would be an unstable, unlearnable string.

What the model reads back is capped: a result (or error) longer than ``max_chars`` keeps its
first and last halves of ``max_chars`` characters around a note saying how much was cut, and
counts in ``tools/truncation_frequency`` (an 8 MB result took 26-48 s to tokenize, and would fill
any context). Arguments nested more than ``parsing.MAX_DEPTH`` levels are a failed call, not a
``RecursionError``.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, Union

from transformers.utils import get_json_schema

from lightning_rlpt.background import in_background
from lightning_rlpt.rollout.episodes.parsing import MAX_DEPTH, ToolCall

DEFAULT_MAX_CHARS = 10_000  # characters of a tool result the model reads (~2,500 tokens)

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    # bool is an int subclass in Python but not a JSON integer/number: true for "a: int" is wrong.
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


@dataclass
class ToolResult:
    """What a call gave back.

    Args:
        content: the text of the ``tool`` message (``"error: ..."`` when ``failed``).
        failed: True for a model mistake or a tool failure (counted in ``tools/failure_frequency``).
        truncated: True when ``content`` was cut to the toolbox's ``max_chars`` (counted in
            ``tools/truncation_frequency``).
    """

    content: str
    failed: bool = False
    truncated: bool = False


@dataclass
class Tool:
    """A Python function the model may call, with its JSON schema.

    Args:
        fn: the function.
        schema: its schema, ``{"type": "function", "function": {"name", "description", "parameters"}}``.

    Examples:
        >>> def double(x: int) -> int:
        ...     '''Twice x.
        ...
        ...     Args:
        ...         x: a number.
        ...     '''
        ...     return 2 * x
        >>> Tool.from_function(double).schema["function"]["parameters"]["properties"]
        {'x': {'type': 'integer', 'description': 'a number.'}}
    """

    fn: Callable[..., Any]
    schema: dict[str, Any]

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> "Tool":
        """The tool for ``fn``; `ValueError` naming the tool when its schema cannot be built.

        Args:
            fn: a function with type hints on every argument and a Google-style docstring
                (a summary line and an ``Args:`` entry per argument).
        """
        if isinstance(fn, Tool):
            return fn
        name = getattr(fn, "__name__", repr(fn))
        if not callable(fn):
            raise ValueError(f"tool {fn!r} is a {type(fn).__name__}, not a function")
        try:
            schema = get_json_schema(fn)
        except Exception as err:  # transformers' Docstring/TypeHintParsingException, NameError for bad hints
            raise ValueError(
                f"tool {name!r} cannot be described to the model: {err}. A tool needs a type hint on "
                "every argument and a docstring with a summary line and an 'Args:' entry per argument "
                "(see docs/agents_tools.md)") from err
        return cls(fn, schema)


class ToolBox:
    """The tools of a run: their schemas for the chat template and their execution.

    Each call runs in a fresh daemon thread and is *abandoned* after ``timeout`` seconds (a
    Python thread cannot be killed: the function keeps running until it returns by itself, its
    result dropped), so a hanging tool costs at most ``timeout`` seconds of the episode.

    Args:
        tools: functions (or `Tool`) with type hints and docstrings; names must be unique.
        timeout: seconds a call may take before it counts as failed; None for no limit.
        max_chars: characters of a result the model reads back (default 10,000, about 2,500
            tokens); a longer one keeps its first and last ``max_chars / 2`` characters around a
            note saying how many were cut (`truncate`). None: no cap.

    Examples:
        >>> def add(a: int, b: int) -> int:
        ...     '''Add two integers.
        ...
        ...     Args:
        ...         a: first.
        ...         b: second.
        ...     '''
        ...     return a + b
        >>> box = ToolBox([add], timeout=1.0)
        >>> box.names, box.call(ToolCall("add", {"a": 2, "b": 3}))
        (['add'], ToolResult(content='5', failed=False, truncated=False))
        >>> print(box.call(ToolCall("add", {"a": "2", "b": 3})).content)
        error: add: argument 'a' must be integer, got string "2"
    """

    def __init__(self, tools: Iterable[Union[Callable[..., Any], Tool]], timeout: float | None = 10.0,
                 max_chars: int | None = DEFAULT_MAX_CHARS):
        self.tools = [Tool.from_function(t) for t in tools]
        if not self.tools:
            raise ValueError("tools is empty; give at least one function, or tools=None for no tools")
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tool names must be unique, {duplicates} appear more than once; rename the functions")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"tool timeout must be > 0 seconds or None, got {timeout}")
        if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1):
            raise ValueError(f"tool_max_chars must be an int >= 1 (characters of a tool result the model reads) or "
                             f"None for no cap, got {max_chars!r}")
        self.timeout, self.max_chars = timeout, max_chars
        self._by_name = dict(zip(names, self.tools))

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas, in order, for ``apply_chat_template(..., tools=box.schemas)``."""
        return [t.schema for t in self.tools]

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; never raises for the model's or the tool's mistakes. The content is cut
        to ``max_chars`` (`truncate`).

        Args:
            call: the parsed call.
        """
        result = self._run(call)
        content, cut = truncate(result.content, self.max_chars)
        return ToolResult(content, result.failed, cut)

    def _run(self, call: ToolCall) -> ToolResult:
        tool = self._by_name.get(call.name)
        if tool is None:
            return _failure(f"unknown tool {call.name!r}; the tools are {self.names}")
        problem = check_arguments(call.arguments, tool.schema["function"]["parameters"])
        if problem:
            return _failure(f"{call.name}: {problem}")
        future = in_background(lambda: tool.fn(**call.arguments), name=f"lightning-rlpt-tool-{call.name}")
        done, _ = cf.wait([future], timeout=self.timeout)
        if not done:
            return _failure(f"{call.name} gave no result within {self.timeout:g} s and was abandoned")
        if future.exception() is not None:
            err = future.exception()
            return _failure(f"{call.name} raised {type(err).__name__}: {err}")
        return to_content(call.name, future.result())


def truncate(text: str, max_chars: int | None) -> tuple[str, bool]:
    """``(text, False)`` when it fits in ``max_chars``; else its first and last halves of
    ``max_chars`` around a note the model reads, and True.

    Examples:
        >>> truncate("0123456789", 4)
        ('01\\n[... 6 characters of the tool result cut here: it is kept to its first 2 and last 2 ...]\\n89', True)
    """
    if max_chars is None or len(text) <= max_chars:
        return text, False
    tail = max_chars // 2
    head = max_chars - tail
    note = (f"\n[... {len(text) - max_chars} characters of the tool result cut here: it is kept to its first {head} "
            f"and last {tail} ...]\n")
    return text[:head] + note + (text[-tail:] if tail else ""), True


def to_content(name: str, value: Any) -> ToolResult:
    """A tool's return value as message text: str as is, other JSON values via ``json.dumps``,
    anything else a failure (see the module docstring).

    Examples:
        >>> to_content("f", [1, 2]), to_content("f", {1, 2}).failed
        (ToolResult(content='[1, 2]', failed=False, truncated=False), True)
    """
    if isinstance(value, str):
        return ToolResult(value)
    try:
        return ToolResult(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return _failure(f"{name} returned a {type(value).__name__}, which is neither a string nor JSON "
                        "(the tool must return str or a JSON-serialisable value)")


def check_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """What is wrong with ``arguments`` for a function schema's ``parameters``, or None.

    Checks unknown and missing arguments, nesting (at most ``MAX_DEPTH`` levels: deeper would
    reach the recursion limit here or in the tool) and JSON types (``"2"`` for an integer is
    wrong: no coercion, so the model learns to write the type the schema says).

    Examples:
        >>> params = {"properties": {"x": {"type": "integer"}}, "required": ["x"]}
        >>> check_arguments({}, params), check_arguments({"x": 1.5}, params)
        ("missing argument 'x'", "argument 'x' must be integer, got number 1.5")
    """
    properties = parameters.get("properties", {})
    unknown = [k for k in arguments if k not in properties]
    if unknown:
        return f"unknown argument {unknown[0]!r}; the arguments are {list(properties)}"
    for key in parameters.get("required", []):
        if key not in arguments:
            return f"missing argument {key!r}"
    for key, value in arguments.items():
        depth = value_depth(value)
        if depth > MAX_DEPTH:
            return f"argument {key!r} is nested {depth} levels deep; at most {MAX_DEPTH} are accepted"
        problem = _check_value(value, properties[key])
        if problem:
            return f"argument {key!r} {problem}"
    return None


def value_depth(value: Any) -> int:
    """Levels of lists/dicts in ``value``, counted without recursion (so any depth is safe).

    Examples:
        >>> value_depth(3), value_depth([1, {"a": [2]}])
        (0, 3)
    """
    depth, level = 0, [value]
    while True:
        level = [v for v in level if isinstance(v, (list, tuple, dict))]
        if not level:
            return depth
        depth += 1
        level = [item for v in level for item in (v.values() if isinstance(v, dict) else v)]


def _check_value(value: Any, spec: dict[str, Any]) -> str | None:
    if value is None and spec.get("nullable"):
        return None
    types = spec.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else list(types)
        if not any(_JSON_TYPES.get(t, lambda v: True)(value) for t in types):
            return f"must be {' or '.join(types)}, got {_json_type(value)} {json.dumps(value)[:50]}"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {spec['enum']}, got {json.dumps(value)[:50]}"
    if isinstance(value, list):
        return _check_items(value, spec)
    return None


def _check_items(value: list, spec: dict[str, Any]) -> str | None:
    prefix: Sequence[dict] = spec.get("prefixItems", [])
    if prefix and len(value) != len(prefix):
        return f"must have {len(prefix)} items, got {len(value)}"
    for i, item in enumerate(value):
        item_spec = prefix[i] if prefix else spec.get("items", {})
        problem = _check_value(item, item_spec)
        if problem:
            return f"item {i} {problem}"
    return None


def _json_type(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value) or isinstance(value, int) and not isinstance(value, bool):
        return "number" if isinstance(value, float) else "integer"
    for name in ("boolean", "string", "array", "object", "null"):
        if _JSON_TYPES[name](value):
            return name
    return type(value).__name__


def _failure(message: str) -> ToolResult:
    return ToolResult("error: " + message, failed=True)
