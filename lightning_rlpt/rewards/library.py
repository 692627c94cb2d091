"""Ready-made reward functions with TRL's signature ``fn(prompts, completions, **columns) -> list[float]``.

- `math_answer_reward` (`MathAnswerReward`): 1.0 when the completion's final answer equals the gold
  answer as mathematics (``\\boxed{1/2}`` = ``0.5`` = ``$\\frac{1}{2}$``), checked with the
  ``math_verify`` library; logged as ``rewards/math_answer/...``.
- `format_reward` (`FormatReward`): 1.0 when the whole completion matches a regular expression
  (by default ``<think>...</think> <answer>...</answer>``); logged as ``rewards/format/...``.
- `soft_overlong_punishment` (`SoftOverlongPunishment`): DAPO's length penalty, 0 down to −1 over
  the last ``soft_punish_cache`` tokens of the budget; logged as ``rewards/overlong/...``.

All are callable classes rather than closures so they pickle (dataloader workers, spawned
processes), and both accept completions as strings or as TRL's conversational lists of messages.
"""
from __future__ import annotations

import re
import threading
import warnings
from typing import Any, Sequence

# One <think> block then one <answer> block and nothing else; the tempered dots stop a block
# from swallowing a second opening or closing tag.
THINK_ANSWER_FORMAT = (r"\s*<think>(?:(?!</?think>).)*</think>\s*"
                       r"<answer>(?:(?!</?answer>).)*</answer>\s*")


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


class MathAnswerReward:
    """1.0 if a completion's answer is mathematically equal to the gold answer, else 0.0.

    Both sides are parsed with ``math_verify.parse`` (LaTeX, ``\\boxed{}``, plain numbers and
    expressions) and compared with ``math_verify.verify``. When a completion contains
    ``<answer>...</answer>`` only the last such block is parsed, so numbers in the reasoning
    are not mistaken for the answer.

    A gold answer that cannot be parsed (``math_verify`` finds nothing in it) scores 0.0 with a
    warning by default. TRL's ``accuracy_reward`` returns None there; TRL then sums it as 0 into
    the total reward and leaves it out of the logged per-function mean. Here rewards must be
    finite numbers, so the score is 0.0. For group-normalised advantages (GRPO) a group whose
    completions all score 0 gets zero advantage, so the prompt adds no policy gradient.
    ``unparseable_gold="raise"`` makes it an error instead. With
    ``RLModule(reward_on_error="zero")`` such samples are then scored 0 and counted in
    ``rewards/math_answer/failures``.

    ``math_verify`` times out slow parses with ``signal.alarm``, which works only in the main
    thread. In any other thread the timeout is turned off, as TRL does, because the call would
    raise otherwise. A pathological expression can then take a long time.

    Args:
        column: the dataset column holding the gold answer (after the datamodule's ``columns``
            map).
        timeout_seconds: limit for each parse and comparison in the main thread; None turns it off.
        unparseable_gold: ``"zero"`` (warn and score 0.0) or ``"raise"``.
        answer_tag: parse only the last ``<tag>...</tag>`` block when one is present; None
            parses the whole completion.

    Example:
        >>> reward = MathAnswerReward()
        >>> reward(["Half of 1?"] * 3, [r"\\boxed{1/2}", "<answer>0.5</answer>", "1/3"], answer=["0.5"] * 3)
        [1.0, 1.0, 0.0]
    """

    __name__ = "math_answer"  # logged as rewards/math_answer/...

    def __init__(self, column: str = "answer", *, timeout_seconds: int | None = 5, unparseable_gold: str = "zero",
                 answer_tag: str | None = "answer"):
        if unparseable_gold not in ("zero", "raise"):
            raise ValueError(f"unparseable_gold must be 'zero' or 'raise' (got {unparseable_gold!r})")
        self.column, self.timeout_seconds = column, timeout_seconds
        self.unparseable_gold, self.answer_tag = unparseable_gold, answer_tag

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        golds = self._golds(columns, len(completions))
        timeout = self.timeout_seconds if threading.current_thread() is threading.main_thread() else None
        parsed_golds: dict[str, list] = {}  # each gold repeats group_size times: parse it once
        scores = []
        for completion, gold in zip(completions, golds):
            gold = "" if gold is None else str(gold)
            if gold not in parsed_golds:
                parsed_golds[gold] = self._parse_gold(gold, timeout)
            scores.append(self._score(parsed_golds[gold], completion_text(completion), timeout))
        return scores

    def _golds(self, columns: dict[str, Any], n: int) -> list[Any]:
        if self.column not in columns:
            raise KeyError(f"math_answer needs the gold answers in column {self.column!r}, but the batch has "
                           f"{sorted(columns)}. Map your dataset's column onto it, e.g. "
                           f"PromptDataModule(..., columns={{'solution': {self.column!r}}}), or use "
                           "MathAnswerReward(column='solution')")
        golds = list(columns[self.column])
        if len(golds) != n:
            raise ValueError(f"column {self.column!r} has {len(golds)} values for {n} completions")
        return golds

    def _parse_gold(self, gold: str, timeout: int | None) -> list:
        from math_verify import parse

        parsed = parse(gold, parsing_timeout=timeout)
        if parsed:
            return parsed
        message = (f"math_answer cannot parse the gold answer {gold[:80]!r}; fix the dataset (write it as a number or "
                   "LaTeX, e.g. '0.5' or '\\frac{1}{2}')")
        if self.unparseable_gold == "raise":
            raise ValueError(message)
        warnings.warn(message + "; such samples score 0.0", stacklevel=3)
        return []

    def _score(self, gold: list, text: str, timeout: int | None) -> float:
        from math_verify import parse, verify

        if not gold:
            return 0.0
        answer = parse(self._answer_span(text), parsing_timeout=timeout)
        return float(bool(answer) and verify(gold, answer, timeout_seconds=timeout))

    def _answer_span(self, text: str) -> str:
        if self.answer_tag is None:
            return text
        tag = re.escape(self.answer_tag)
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
        return blocks[-1] if blocks else text


class FormatReward:
    """1.0 if the whole completion matches a regular expression, else 0.0.

    Args:
        pattern: a regex (string or compiled) that must match the *whole* completion
            (``re.fullmatch``); by default `THINK_ANSWER_FORMAT`: one ``<think>`` block, then one
            ``<answer>`` block, surrounding whitespace allowed.
        flags: regex flags for a string pattern; ``re.DOTALL`` lets ``.`` cross lines.

    Example:
        >>> format_reward = FormatReward()
        >>> format_reward(["q", "q"], ["<think>2+2</think>\\n<answer>4</answer>", "4"])
        [1.0, 0.0]
        >>> FormatReward(r"\\d+")(["q", "q"], ["42", "forty-two"])
        [1.0, 0.0]
    """

    __name__ = "format"  # logged as rewards/format/...

    def __init__(self, pattern: str | re.Pattern = THINK_ANSWER_FORMAT, flags: int = re.DOTALL):
        try:
            self.pattern = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, flags)
        except re.error as err:
            raise ValueError(f"format pattern {pattern!r} is not a valid regular expression: {err}") from err

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
        return [float(self.pattern.fullmatch(completion_text(c)) is not None) for c in completions]


class SoftOverlongPunishment:
    """DAPO's soft overlong punishment (Yu et al., "DAPO", arXiv 2503.14476: overlong reward shaping), a reward
    to add to the task's, on the completion's length ``L`` in tokens:

    ``0`` if ``L ≤ L_max − L_cache``; ``((L_max − L_cache) − L) / L_cache`` if
    ``L_max − L_cache < L ≤ L_max``; ``−1`` if ``L > L_max``.

    Args:
        max_completion_len: ``L_max``, usually the generation budget (``max_new_tokens``).
        soft_punish_cache: ``L_cache``, the length of the ramp (DAPO: 4,096 of 20,480);
            ``0 <= L_cache <= L_max``; 0 leaves only the −1 beyond ``L_max``.

    The length is ``len(completion_ids)``: model tokens only, EOS included when it was sampled.
    TRL's equivalent is ``trl.rewards.get_soft_overlong_punishment`` (same arguments).

    Example:
        >>> punish = SoftOverlongPunishment(max_completion_len=10, soft_punish_cache=4)
        >>> punish(["q"] * 3, ["", "", ""], completion_ids=[[1] * 6, [1] * 8, [1] * 10])
        [0.0, -0.5, -1.0]
    """

    __name__ = "overlong"  # logged as rewards/overlong/...

    def __init__(self, max_completion_len: int, soft_punish_cache: int):
        if max_completion_len < 1 or not 0 <= soft_punish_cache <= max_completion_len:
            raise ValueError("soft overlong punishment needs max_completion_len >= 1 and 0 <= soft_punish_cache <= "
                             f"max_completion_len (got {max_completion_len}, {soft_punish_cache})")
        self.max_len, self.cache = max_completion_len, soft_punish_cache

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                 **_: Any) -> list[float]:
        return [self.penalty(len(ids)) for ids in completion_ids]

    def penalty(self, length: int) -> float:
        start = self.max_len - self.cache
        if length <= start:
            return 0.0
        if length > self.max_len:
            return -1.0
        return (start - length) / self.cache


def soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> SoftOverlongPunishment:
    """`SoftOverlongPunishment` under TRL's argument names (``get_soft_overlong_punishment``)."""
    return SoftOverlongPunishment(max_completion_len, soft_punish_cache)


math_answer_reward = MathAnswerReward()
format_reward = FormatReward()
