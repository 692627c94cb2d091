"""HermesToolParser: well-formed calls are read, every malformed one becomes an error message
that says what was wrong and shows the format; custom parsers plug in."""
from __future__ import annotations

import sys

import pytest

from lightning_rlpt.rollout.episodes.parsing import HermesToolParser, ParsedTurn, ToolCall, as_parser

parse = HermesToolParser().parse


def test_several_calls_in_one_turn_in_order():
    text = ('I will compute. <tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'
            '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> done')
    turn = parse(text)
    assert turn.calls == [ToolCall("multiply", {"a": 12, "b": 34}), ToolCall("add", {"a": 1, "b": 2})]
    assert turn.errors == [] and turn.has_calls


def test_no_call_is_a_final_answer():
    turn = parse("The answer is 408.")
    assert turn == ParsedTurn() and not turn.has_calls


def test_missing_arguments_means_none_and_string_arguments_are_decoded():
    assert parse('<tool_call>{"name": "now"}</tool_call>').calls == [ToolCall("now", {})]
    assert parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>').calls == [ToolCall("f", {"x": 1})]


@pytest.mark.parametrize("body, says", [
    ('{"name": "f", "arguments": {"a": 1}', "not valid JSON"),
    ("[1, 2]", "JSON list, not an object"),
    ('{"arguments": {}}', 'no "name" string'),
    ('{"name": 3}', 'no "name" string'),
    ('{"name": "f", "arguments": [1]}', '"arguments" must be a JSON object, got list'),
])
def test_malformed_call_is_an_error_with_the_format(body, says):
    turn = parse(f"<tool_call>{body}</tool_call>")
    assert turn.calls == [] and len(turn.errors) == 1 and turn.has_calls
    assert says in turn.errors[0]
    assert '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>' in turn.errors[0]


def test_good_and_bad_calls_are_numbered_and_unclosed_call_is_an_error():
    turn = parse('<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{bad}</tool_call>'
                 '<tool_call>{"name": "g"')
    assert turn.calls == [ToolCall("f", {})]
    assert turn.errors[0].startswith("tool call 2 is not valid JSON")
    assert turn.errors[1].startswith("tool call 3 has no closing </tool_call>")


def test_custom_tags():
    turn = HermesToolParser("[CALL]", "[/CALL]").parse('[CALL]{"name": "f", "arguments": {"x": 2}}[/CALL]')
    assert turn.calls == [ToolCall("f", {"x": 2})]


def test_parser_plug_ins():
    def my_parser(text: str) -> ParsedTurn:
        name, _, arg = text.partition(" ")
        return ParsedTurn([ToolCall(name, {"x": arg})])

    assert as_parser(my_parser).parse("echo hi").calls == [ToolCall("echo", {"x": "hi"})]
    custom = HermesToolParser("<a>", "</a>")
    assert as_parser(custom) is custom
    with pytest.raises(TypeError, match="returned str; it must return a ParsedTurn"):
        as_parser(lambda text: text).parse("x")
    with pytest.raises(TypeError, match=r"tool_parser is the class HermesToolParser; pass an instance, e.g. HermesToolParser\(\)"):
        as_parser(HermesToolParser)
    with pytest.raises(TypeError, match="tool_parser must have a parse"):
        as_parser(3)


BIG = "9" * 5000  # past Python's 4,300-digit limit: json.loads raises ValueError (not JSONDecodeError)
TOO_DEEP = "[" * 1000 + "]" * 1000  # past the recursion limit: json.loads raises RecursionError
DIGITS = "has an integer of more than 4300 digits, which cannot be read (write it as a string)"
DEEP = "is nested too deeply to read (nest at most 100 levels)"


@pytest.mark.parametrize("body, says", [
    ('{"name": "f", "arguments": {"a": %s}}' % BIG, f"tool call 1 {DIGITS}"),
    ('{"name": "f", "arguments": {"a": %s}}' % TOO_DEEP, f"tool call 1 {DEEP}"),
    ('{"name": "f", "arguments": %s}' % ("[" * 100_000 + "]" * 100_000), f"tool call 1 {DEEP}"),
    ('{"name": "f", "arguments": "{\\"a\\": %s}"}' % BIG, f'tool call 1 (f): "arguments" is a string that {DIGITS}'),
    ('{"name": "f", "arguments": "{\\"a\\": %s}"}' % TOO_DEEP, f'tool call 1 (f): "arguments" is a string that {DEEP}'),
])
def test_json_python_cannot_read_is_an_error_not_an_exception(body, says):
    """These escaped as ValueError / RecursionError and ended the run."""
    turn = parse(f'<tool_call>{body}</tool_call><tool_call>{{"name": "g", "arguments": {{}}}}</tool_call>')
    assert turn.calls == [ToolCall("g", {})] and len(turn.errors) == 1  # the good call after it is still read
    assert turn.errors[0].startswith(says + '; write <tool_call>{"name": "<tool>"')


def test_a_long_name_is_shortened_in_the_error():
    turn = parse('<tool_call>{"name": "%s", "arguments": [1]}</tool_call>' % ("f" * 100_000))
    assert turn.errors[0].startswith(f'tool call 1 ({"f" * 50}): "arguments" must be a JSON object, got list')


def test_the_depth_refusal_does_not_depend_on_the_recursion_limit():
    """Libraries raise ``sys.setrecursionlimit`` (seen in the full suite), after which 1,000 levels
    parsed and reached the tool: the parser refuses past 100 argument levels whatever the limit."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        turn = parse('<tool_call>{"name": "f", "arguments": {"a": %s}}</tool_call>' % TOO_DEEP)
        ok = parse('<tool_call>{"name": "f", "arguments": {"a": %s}}</tool_call>' % ("[" * 100 + "]" * 100))
    finally:
        sys.setrecursionlimit(old)
    assert turn.calls == [] and turn.errors[0].startswith(f"tool call 1 {DEEP}")
    assert len(ok.calls) == 1 and ok.errors == []  # 100 levels of an argument are read, as ToolBox accepts them
