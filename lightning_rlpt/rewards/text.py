"""The text of a completion, whether it arrives as a string or as TRL's list of messages; the
dataset column a ready-made reward reads."""
from __future__ import annotations

from typing import Any


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or the last assistant message of a conversation.

    Args:
        completion: a string, or a list of ``{"role", "content"}`` dicts (TRL's conversational
            form); a message's content may also be a list of ``{"type": "text", "text"}`` parts.

    Examples:
        >>> completion_text([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "42"}])
        '42'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):  # a single message
        completion = [completion]
    messages = [m for m in completion if isinstance(m, dict)]
    replies = [m for m in messages if m.get("role", "assistant") == "assistant"]
    if not replies:
        raise ValueError(f"completion {str(completion)[:80]!r} has no assistant message: give a string or a list of "
                         "{'role': 'assistant', 'content': ...} messages")
    content = replies[-1].get("content") or ""
    if isinstance(content, list):  # multimodal-style parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def required_column(columns: dict[str, Any], name: str, n: int, *, reward: str, holds: str, example_source: str,
                    option: str) -> list[Any]:
    """The ``n`` values of dataset column ``name`` that ``reward`` reads, or an error that says
    how to map a dataset's column onto it (``example_source``) or rename it (``option``).

    Examples:
        >>> required_column({"answer": ["4"]}, "answer", 1, reward="math_answer", holds="the gold answers",
        ...                 example_source="solution", option="MathAnswerReward(column='solution')")
        ['4']
    """
    if name not in columns:
        raise KeyError(f"{reward} needs {holds} in column {name!r}, but the batch has {sorted(columns)}. Map your "
                       f"dataset's column onto it, e.g. PromptDataModule(..., columns={{{example_source!r}: {name!r}}}), "
                       f"or use {option}")
    values = list(columns[name])
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
    return values
