"""A reward for math answers, checked for mathematical equality by ``math_verify``."""
from __future__ import annotations

import re
import threading
import warnings
from typing import Any, Sequence

from .text import completion_text, required_column


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

    Examples:
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
        return required_column(columns, self.column, n, reward="math_answer", holds="the gold answers",
                               example_source="solution", option="MathAnswerReward(column='solution')")

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


math_answer_reward = MathAnswerReward()
