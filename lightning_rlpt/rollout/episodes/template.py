"""The chat template in a multi-turn episode: a start-up check that it supports tools, and the
tokens it adds between the model's turn and the next one (`render_suffix`).

An episode's context grows by appending, never by re-rendering: the model's own tokens stay
exactly as sampled (re-tokenizing their text could split it differently, and the log-probs
would then belong to other tokens), and only the template's text *after* the model's turn —
its end-of-turn marker, the tool or observation messages, the next generation prompt — is
rendered and tokenized.
"""
from __future__ import annotations

from typing import Any, Sequence

_PROBE_RESULT = "lightning-rlpt probe tool result 7d1f"
# Stands in for the model's turn so the suffix does not depend on what the model wrote.
_SENTINEL = "lightning-rlpt-assistant-turn-5c2e"
_FIX = ("use a tokenizer whose chat template supports tools (e.g. Qwen2.5/Qwen3 Instruct, Hermes), or set "
        "tokenizer.chat_template to one that renders the tools= schemas and 'tool' messages (docs/agents_tools.md)")


def check_tools_template(tokenizer: Any, schemas: Sequence[dict[str, Any]]) -> None:
    """Raise `ValueError` at start unless the chat template supports tools.

    It does when a probe conversation rendered with ``tools=schemas`` differs from the same
    conversation without (the template shows the model its tools) and a ``tool`` message
    renders with its content (the model sees the results).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        schemas: the tools' JSON schemas (`ToolBox.schemas`).

    Examples:
        >>> import sys; sys.path.insert(0, "tests")
        >>> from episodes_fixtures import build_chat_tokenizer
        >>> check_tools_template(build_chat_tokenizer(tools=True), [{"type": "function", "function": {
        ...     "name": "f", "description": "F.", "parameters": {"type": "object", "properties": {}}}}])
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tools need a chat template, but the tokenizer has none; {_FIX}")
    question = [{"role": "user", "content": "What is 2 times 3?"}]
    with_tools, without = _render(tokenizer, question, tools=list(schemas)), _render(tokenizer, question)
    if with_tools == without:
        raise ValueError(f"the tokenizer's chat template ignores tools= (the model would never see its tools); {_FIX}")
    probe = question + [{"role": "assistant", "content": "calling"}, {"role": "tool", "content": _PROBE_RESULT}]
    try:
        rendered = _render(tokenizer, probe, tools=list(schemas))
    except Exception as err:  # jinja's raise_exception, TemplateError
        raise ValueError(f"the tokenizer's chat template cannot render a 'tool' message ({err}); {_FIX}") from err
    if _PROBE_RESULT not in rendered:
        raise ValueError(f"the tokenizer's chat template drops 'tool' messages (the model would never see results); {_FIX}")


def render_suffix(tokenizer: Any, messages: Sequence[dict[str, Any]], new_messages: Sequence[dict[str, Any]],
                  template_kwargs: dict[str, Any] | None = None, *, model_end: str = "") -> list[int]:
    """Token ids of the text the template puts after the model's last turn when ``new_messages``
    follow and the next generation prompt is added.

    ``messages`` ends with the model's assistant turn. Its content is replaced by a sentinel,
    both conversations are rendered (``messages`` alone, and ``messages + new_messages`` with
    ``add_generation_prompt=True``), and the suffix is the text after the sentinel in the
    longer one, tokenized with ``add_special_tokens=False``. So the suffix starts with the
    template's end-of-turn text (``<|im_end|>\\n`` for ChatML) and does not depend on what the
    model wrote.

    ``model_end`` is the text of what the model generated after its content, usually the EOS
    (``tokenizer.decode([eos_id])``) when its turn ended there: when the suffix starts with it,
    it is removed, so the context holds the model's own EOS followed by the rest of the
    template's end-of-turn (``\\n`` for ChatML). When it does not (the model stopped on a token
    that is not the template's end of turn), the suffix is kept whole.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: the conversation so far, ending with an assistant message.
        new_messages: the ``tool`` results or the environment's ``user`` observation.
        template_kwargs: passed to ``apply_chat_template`` (``tools=``, ``enable_thinking=``, ...).
        model_end: the text of the model's end-of-turn tokens already in the context.

    Only the model's turn and what follows it must agree between the two renderings: the
    template must close the turn the same way whether or not more messages follow, else
    `ValueError`. Earlier turns may render differently (Qwen3's template, for one, adds an
    empty ``<think>`` block to the last assistant turn only); the context keeps what the model
    actually saw, which is what it is trained on.

    Raises:
        ValueError: the template closes the last assistant turn differently from one that more
            messages follow, or drops the assistant's content.

    Examples:
        >>> import sys; sys.path.insert(0, "tests")
        >>> from episodes_fixtures import build_chat_tokenizer
        >>> tok = build_chat_tokenizer()
        >>> ids = render_suffix(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}],
        ...                     [{"role": "user", "content": "ok"}], model_end="<|im_end|>")
        >>> tok.decode(ids)
        '\\n<|im_start|>user\\nok<|im_end|>\\n<|im_start|>assistant\\n'
    """
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("render_suffix needs messages that end with the model's assistant turn")
    kwargs = {k: v for k, v in (template_kwargs or {}).items() if k not in ("add_generation_prompt", "tokenize")}
    masked = [*messages[:-1], {**messages[-1], "content": _SENTINEL}]
    short = _render(tokenizer, masked, **kwargs)
    long = _render(tokenizer, masked + list(new_messages), add_generation_prompt=True, **kwargs)
    if _SENTINEL not in short or _SENTINEL not in long:
        raise ValueError("the chat template drops the assistant's content; episodes need a template that renders "
                         "assistant messages verbatim")
    closing = short[short.rfind(_SENTINEL) + len(_SENTINEL):]
    suffix = long[long.rfind(_SENTINEL) + len(_SENTINEL):]
    if not suffix.startswith(closing):
        raise ValueError(f"the chat template ends the model's turn with {closing!r} when it is the last message but "
                         f"not when more follow ({suffix[:len(closing) + 20]!r}...), so the episode's context could "
                         "not grow by appending; use a template that closes assistant turns the same way")
    if model_end and suffix.startswith(model_end):
        suffix = suffix[len(model_end):]
    return list(tokenizer(suffix, add_special_tokens=False)["input_ids"])


def _render(tokenizer: Any, messages: Sequence[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, **kwargs)
