"""Tool and ToolBox: bad tools refused at construction naming the tool; every model or tool
mistake becomes a failed ToolResult whose text says what was wrong, never an exception."""
from __future__ import annotations

import threading
import time
from typing import Optional

import pytest

from lightning_rlpt.rollout.episodes.parsing import ToolCall
from lightning_rlpt.rollout.episodes.tools import Tool, ToolBox, ToolResult


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def scale(xs: list[float], factor: Optional[float] = None) -> list[float]:
    """Scale numbers.

    Args:
        xs: the numbers.
        factor: the factor (default 2).
    """
    return [x * (factor or 2) for x in xs]


def test_schema_is_transformers_own():
    from transformers.utils import get_json_schema

    tool = Tool.from_function(multiply)
    assert tool.name == "multiply" and tool.schema == get_json_schema(multiply)
    box = ToolBox([multiply, scale])
    assert box.names == ["multiply", "scale"] and box.schemas == [get_json_schema(multiply), get_json_schema(scale)]


def test_call_runs_the_function():
    box = ToolBox([multiply, scale])
    assert box.call(ToolCall("multiply", {"a": 123, "b": 456})) == ToolResult("56088", False)
    assert box.call(ToolCall("scale", {"xs": [1, 2.5]})) == ToolResult("[2, 5.0]", False)
    assert box.call(ToolCall("scale", {"xs": [1], "factor": None})).content == "[2]"


def test_tool_without_type_hints_or_docstring_is_refused_naming_it():
    def no_hints(a):
        """Something.

        Args:
            a: a value.
        """

    def no_doc(a: int):
        return a

    def undocumented_arg(a: int, b: int):
        """Adds.

        Args:
            a: first.
        """

    with pytest.raises(ValueError, match=r"tool 'no_hints' cannot be described.*missing a type hint.*type hint on every argument"):
        ToolBox([multiply, no_hints])
    with pytest.raises(ValueError, match=r"tool 'no_doc' cannot be described.*no docstring"):
        ToolBox([no_doc])
    with pytest.raises(ValueError, match=r"tool 'undocumented_arg'.*no description for the argument 'b'"):
        Tool.from_function(undocumented_arg)


def test_box_construction_errors():
    with pytest.raises(ValueError, match="names must be unique, \\['multiply'\\]"):
        ToolBox([multiply, multiply])
    with pytest.raises(ValueError, match="tools is empty"):
        ToolBox([])
    with pytest.raises(ValueError, match="timeout must be > 0"):
        ToolBox([multiply], timeout=0)
    with pytest.raises(ValueError, match="tool 'x' is a str, not a function"):
        Tool.from_function("x")


@pytest.mark.parametrize("call, message", [
    (ToolCall("divide", {"a": 1}), "error: unknown tool 'divide'; the tools are ['multiply', 'scale']"),
    (ToolCall("multiply", {"a": "12", "b": 3}), "error: multiply: argument 'a' must be integer, got string \"12\""),
    (ToolCall("multiply", {"a": 1.5, "b": 3}), "error: multiply: argument 'a' must be integer, got number 1.5"),
    (ToolCall("multiply", {"a": True, "b": 3}), "error: multiply: argument 'a' must be integer, got boolean true"),
    (ToolCall("multiply", {"a": 1}), "error: multiply: missing argument 'b'"),
    (ToolCall("multiply", {"a": 1, "b": 2, "c": 3}), "error: multiply: unknown argument 'c'; the arguments are ['a', 'b']"),
    (ToolCall("scale", {"xs": [1, "2"]}), "error: scale: argument 'xs' item 1 must be number, got string \"2\""),
    (ToolCall("scale", {"xs": 1.0}), "error: scale: argument 'xs' must be array, got number 1.0"),
])
def test_model_mistakes_are_failed_results(call, message):
    assert ToolBox([multiply, scale]).call(call) == ToolResult(message, failed=True)


def test_tool_that_raises_is_a_failed_result():
    def divide(a: int, b: int) -> float:
        """Divide.

        Args:
            a: numerator.
            b: denominator.
        """
        return a / b

    result = ToolBox([divide]).call(ToolCall("divide", {"a": 1, "b": 0}))
    assert result == ToolResult("error: divide raised ZeroDivisionError: division by zero", failed=True)


def test_tool_that_hangs_is_abandoned_at_the_timeout():
    release = threading.Event()

    def hang(x: int) -> int:
        """Never returns until released.

        Args:
            x: anything.
        """
        release.wait(30)
        return x

    box = ToolBox([hang, multiply], timeout=0.3)
    start = time.monotonic()
    result = box.call(ToolCall("hang", {"x": 1}))
    elapsed = time.monotonic() - start
    release.set()  # let the abandoned daemon thread end
    assert result == ToolResult("error: hang gave no result within 0.3 s and was abandoned", failed=True)
    assert 0.3 <= elapsed < 2.0
    assert box.call(ToolCall("multiply", {"a": 2, "b": 3})).content == "6"  # the box still works


def test_non_string_returns_json_or_failure():
    """Documented choice: str as is, JSON-serialisable via json.dumps, others refused."""
    values = {"text": "hi", "number": 2.5, "none": None, "mapping": {"k": [1, True]}, "a_set": {1}, "nan": float("nan"),
              "obj": object()}

    def get(key: str):
        """Return a stored value.

        Args:
            key: which one.
        """
        return values[key]

    box = ToolBox([get])
    contents = {k: box.call(ToolCall("get", {"key": k})) for k in values}
    assert contents["text"] == ToolResult("hi") and contents["number"] == ToolResult("2.5")
    assert contents["none"] == ToolResult("null") and contents["mapping"] == ToolResult('{"k": [1, true]}')
    for key, kind in (("a_set", "set"), ("nan", "float"), ("obj", "object")):
        assert contents[key] == ToolResult(
            f"error: get returned a {kind}, which is neither a string nor JSON (the tool must return str or a "
            "JSON-serialisable value)", failed=True)


def count(xs: list) -> int:
    """Count items.

    Args:
        xs: the items, of any kind.
    """
    return len(xs)


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_deeply_nested_argument_is_a_failed_call_not_a_recursion_error():
    """A 500-deep list for ``xs: list`` (items unchecked by type, so checked level by level) used
    to raise RecursionError out of ToolBox.call; 100 levels are accepted."""
    box = ToolBox([count])
    assert box.call(ToolCall("count", {"xs": _nested(500)})) == ToolResult(
        "error: count: argument 'xs' is nested 500 levels deep; at most 100 are accepted", failed=True)
    assert box.call(ToolCall("count", {"xs": [{"a": _nested(200)}]})).content.startswith(
        "error: count: argument 'xs' is nested 202 levels deep")
    assert box.call(ToolCall("count", {"xs": _nested(100)})) == ToolResult("1")


def loud(n: int, fail: bool) -> str:
    """Print a lot.

    Args:
        n: how many characters.
        fail: raise instead of returning them.
    """
    text = "<" + "x" * (n - 2) + ">"
    if fail:
        raise ValueError(text)
    return text


def test_a_long_result_is_cut_in_the_middle_with_a_note_the_model_reads():
    box = ToolBox([loud], max_chars=100)
    result = box.call(ToolCall("loud", {"n": 5000, "fail": False}))
    assert result == ToolResult("<" + "x" * 49 + "\n[... 4900 characters of the tool result cut here: it is kept to "
                                "its first 50 and last 50 ...]\n" + "x" * 49 + ">", failed=False, truncated=True)
    error = box.call(ToolCall("loud", {"n": 5000, "fail": True}))  # an error message is capped too
    assert error.failed and error.truncated and error.content.startswith("error: loud raised ValueError: <xxx")
    assert error.content.endswith("xx>") and len(error.content) < 200
    assert box.call(ToolCall("loud", {"n": 100, "fail": False})) == ToolResult("<" + "x" * 98 + ">")  # fits exactly


def test_the_default_cap_is_10000_characters_and_none_lifts_it():
    eight_mb = ToolCall("loud", {"n": 8_000_000, "fail": False})
    capped = ToolBox([loud]).call(eight_mb)
    assert capped.truncated and capped.content.startswith("<" + "x" * 4999 + "\n[... 7990000 characters")
    assert len(capped.content) < 10_200
    assert ToolBox([loud], max_chars=None).call(eight_mb) == ToolResult("<" + "x" * 7_999_998 + ">")


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_tool_max_chars_must_be_a_positive_int_or_none(bad):
    with pytest.raises(ValueError, match=rf"tool_max_chars must be an int >= 1 .* or None for no cap, got {bad}"):
        ToolBox([multiply], max_chars=bad)
