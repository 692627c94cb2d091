"""check_tools_template refuses templates without tool support at start; render_suffix gives
exactly the tokens the full rendering has after the model's turn."""
from __future__ import annotations

import pytest
from episodes_fixtures import PLAIN_TEMPLATE, TOOLS_TEMPLATE, build_chat_tokenizer

from lightning_rlpt.rollout.episodes.template import check_tools_template, render_suffix
from lightning_rlpt.rollout.episodes.tools import ToolBox


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


SCHEMAS = ToolBox([multiply]).schemas
CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'


def test_template_with_tools_passes():
    check_tools_template(build_chat_tokenizer(tools=True), SCHEMAS)


def test_template_without_tools_is_refused_at_start():
    with pytest.raises(ValueError, match=r"ignores tools=.*use a tokenizer whose chat template supports tools"):
        check_tools_template(build_chat_tokenizer(tools=False), SCHEMAS)
    tok = build_chat_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="tools need a chat template, but the tokenizer has none"):
        check_tools_template(tok, SCHEMAS)


def test_template_that_cannot_render_or_drops_tool_messages_is_refused():
    tok = build_chat_tokenizer()
    tok.chat_template = "{% if messages[-1].role == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}" + TOOLS_TEMPLATE
    with pytest.raises(ValueError, match=r"cannot render a 'tool' message \(no tool role\)"):
        check_tools_template(tok, SCHEMAS)
    tok.chat_template = TOOLS_TEMPLATE.replace("m.content + '\\n</tool_response>'", "'\\n</tool_response>'")
    with pytest.raises(ValueError, match="drops 'tool' messages"):
        check_tools_template(tok, SCHEMAS)


@pytest.mark.parametrize("new", [
    [{"role": "tool", "content": "408"}],
    [{"role": "tool", "content": "408"}, {"role": "tool", "content": "error: unknown tool 'add'"}],
    [{"role": "user", "content": "Wrong, try again."}],
])
@pytest.mark.parametrize("system", [False, True])
def test_suffix_is_the_tail_of_the_full_rendering(new, system):
    """Context built by appending (prompt + the model's tokens + suffix) == the full rendering's
    tokens, with the model's EOS already in the context (model_end)."""
    tok = build_chat_tokenizer()
    messages = ([{"role": "system", "content": "Be brief."}] if system else []) + [
        {"role": "user", "content": "What is 12*34?"}, {"role": "assistant", "content": CALL}]
    kwargs = {"tools": SCHEMAS}
    full = tok.apply_chat_template(messages + new, add_generation_prompt=True, return_dict=False, **kwargs)
    prompt = tok.apply_chat_template(messages[:-1], add_generation_prompt=True, return_dict=False, **kwargs)
    model = tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]  # what the model sampled
    suffix = render_suffix(tok, messages, new, kwargs, model_end=tok.eos_token)
    assert prompt + model + suffix == full
    assert suffix == full[len(full) - len(suffix):] and tok.decode(suffix[:1]) == "\n"


def test_suffix_without_model_end_keeps_the_end_of_turn_and_ignores_the_content():
    tok = build_chat_tokenizer()
    new = [{"role": "tool", "content": "408"}]
    a = render_suffix(tok, [{"role": "user", "content": "q"}, {"role": "assistant", "content": CALL}], new, {"tools": SCHEMAS})
    b = render_suffix(tok, [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}], new, {"tools": SCHEMAS})
    assert a == b
    assert tok.decode(a) == "<|im_end|>\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    # a model_end the template does not start with leaves the suffix whole
    assert render_suffix(tok, [{"role": "assistant", "content": "x"}], new, {"tools": SCHEMAS}, model_end="</s>") == a


def test_earlier_turns_may_render_differently_as_in_qwen3():
    """A Qwen3-like template adds an empty think block to the *last* assistant turn only; the
    suffix is still the tail of the full rendering."""
    tok = build_chat_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE.replace(
        "'<|im_start|>' + m.role + '\\n' + m.content",
        "'<|im_start|>' + m.role + '\\n' + ('<think>\\n\\n</think>\\n\\n' if loop.last and m.role == 'assistant' else '') + m.content")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": CALL}]
    new = [{"role": "tool", "content": "408"}]
    assert "<think>" in tok.apply_chat_template(messages, tokenize=False)
    full = tok.apply_chat_template(messages + new, add_generation_prompt=True, return_dict=False)
    suffix = render_suffix(tok, messages, new)
    assert suffix == full[len(full) - len(suffix):]
    assert tok.decode(suffix) == "<|im_end|>\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_template_that_closes_the_last_turn_differently_is_refused():
    tok = build_chat_tokenizer(tools=False)
    tok.chat_template = PLAIN_TEMPLATE.replace("'<|im_end|>\\n' }}", "'<|im_end|>\\n' + ('[END]' if loop.last else '') }}")
    with pytest.raises(ValueError, match=r"ends the model's turn with '<\|im_end\|>\\n\[END\]' when it is the last message"):
        render_suffix(tok, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                      [{"role": "user", "content": "more"}])
    with pytest.raises(ValueError, match="end with the model's assistant turn"):
        render_suffix(tok, [{"role": "user", "content": "q"}], [{"role": "user", "content": "more"}])
    tok.chat_template = PLAIN_TEMPLATE.replace("m.content", "('' if m.role == 'assistant' else m.content)")
    with pytest.raises(ValueError, match="drops the assistant's content"):
        render_suffix(tok, [{"role": "assistant", "content": "a"}], [{"role": "user", "content": "more"}])
