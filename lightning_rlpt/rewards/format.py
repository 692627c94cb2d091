"""Format rewards: 1.0 when the whole completion matches a regular expression, else 0.0.

- `format_reward`: one ``<think>...</think>`` block, then one ``<answer>...</answer>`` block
  (`THINK_ANSWER_FORMAT`); logged as ``rewards/format/...``.
- `think_format_reward`: TRL's reward of that name. The completion starts with ``<think>``,
  closes it with ``</think>`` and opens no second ``<think>``; anything may follow, the answer
  untagged (`THINK_FORMAT`). Logged as ``rewards/think_format/...``.
- `FormatReward(pattern)`: any other pattern.

Examples:
    >>> think_format_reward(["q"] * 3, ["<think>\\n2+2\\n</think>\\n4", "<think>\\n2+2 is 4", " <think>x</think>4"])
    [1.0, 0.0, 0.0]
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from .text import completion_text

# One <think> block then one <answer> block and nothing else; the tempered dots stop a block
# from swallowing a second opening or closing tag.
THINK_ANSWER_FORMAT = (r"\s*<think>(?:(?!</?think>).)*</think>\s*"
                       r"<answer>(?:(?!</?answer>).)*</answer>\s*")
# TRL's think_format_reward: opens with <think> (no second one), closes it, anything after.
THINK_FORMAT = r"<think>(?!.*<think>).*?</think>.*"


class FormatReward:
    """1.0 if the whole completion matches a regular expression, else 0.0.

    Args:
        pattern: a regex (string or compiled) that must match the *whole* completion
            (``re.fullmatch``); by default `THINK_ANSWER_FORMAT`: one ``<think>`` block, then one
            ``<answer>`` block, surrounding whitespace allowed.
        flags: regex flags for a string pattern; ``re.DOTALL`` lets ``.`` cross lines.
        name: logged as ``rewards/<name>/...``.

    Examples:
        >>> format_reward = FormatReward()
        >>> format_reward(["q", "q"], ["<think>2+2</think>\\n<answer>4</answer>", "4"])
        [1.0, 0.0]
        >>> FormatReward(r"\\d+")(["q", "q"], ["42", "forty-two"])
        [1.0, 0.0]
    """

    def __init__(self, pattern: str | re.Pattern = THINK_ANSWER_FORMAT, flags: int = re.DOTALL, name: str = "format"):
        self.__name__ = name
        try:
            self.pattern = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, flags)
        except re.error as err:
            raise ValueError(f"format pattern {pattern!r} is not a valid regular expression: {err}") from err

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
        return [float(self.pattern.fullmatch(completion_text(c)) is not None) for c in completions]


format_reward = FormatReward()
think_format_reward = FormatReward(THINK_FORMAT, name="think_format")
