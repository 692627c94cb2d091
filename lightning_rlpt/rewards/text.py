"""The text of a completion, whether it arrives as a string or as TRL's list of messages."""
from __future__ import annotations

from typing import Any


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or the last assistant message of a conversation.

    Args:
        completion: a string, or a list of ``{"role", "content"}`` dicts (TRL's conversational
            form); a message's content may also be a list of ``{"type": "text", "text"}`` parts.

    Example:
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
