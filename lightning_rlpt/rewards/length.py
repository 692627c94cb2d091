"""Length rewards: DAPO's soft overlong punishment and Kimi k1.5's length penalty."""
from __future__ import annotations

from typing import Any, Callable, Sequence


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

    Examples:
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


class LengthPenalty:
    """Kimi k1.5's length reward (Kimi Team, "Kimi k1.5", arXiv 2501.12599, §2.3.3 "Length Penalty"),
    to add beside the task's reward: within the group of a prompt's completions, with token
    lengths from ``min_len`` to ``max_len``,

    ``λ = 0.5 − (len − min_len) / (max_len − min_len)``; the reward is ``λ`` for a correct
    completion and ``min(0, λ)`` for a wrong one.

    So the shortest correct answer gets +0.5 and the longest −0.5, and wrong answers are only ever
    pushed down, never rewarded for being short. A group whose completions all have the same
    length gets 0, as in the paper. The paper adds it with a weight (``reward_weights``) and
    warms it up: training starts without it, then it stays constant.

    Correctness is the score of another reward function on the same batch, e.g.
    `math_answer_reward`: a completion is correct when that score is ``>= threshold``. Lengths
    are ``len(completion_ids)``, model tokens with EOS when sampled.

    Groups: rewards receive flat lists of ``prompts × group_size`` completions, each prompt's
    completions together. A group is the completions with the same ``group_column`` value
    (``"index"``, the row's position in its dataset, which `PromptDataset` adds); when the batch
    has no such column, the completions with equal prompts (the prompt is part of the key either
    way, so two sources of a mixture that share an index stay apart).

    Args:
        correctness: a reward function ``fn(prompts, completions, **columns)``; its score
            decides which completions are correct.
        threshold: the score at or above which a completion is correct.
        group_column: the column whose equal values make a group; without it, equal prompts.

    Examples:
        >>> def exact(prompts, completions, answer, **_): return [float(c == a) for c, a in zip(completions, answer)]
        >>> penalty = LengthPenalty(exact)
        >>> lengths = [10, 20, 30, 40]  # two correct answers, then two wrong ones
        >>> scores = penalty(["2+2"] * 4, ["4", "4", "5", "5"], answer=["4"] * 4, completion_ids=[[1] * n for n in lengths])
        >>> [round(s, 3) for s in scores]
        [0.5, 0.167, -0.167, -0.5]
    """

    __name__ = "length"  # logged as rewards/length/...

    def __init__(self, correctness: Callable[..., Sequence[float]], threshold: float = 1.0,
                 group_column: str | None = "index"):
        if not callable(correctness):
            raise TypeError(f"correctness must be a reward function fn(prompts, completions, **columns), e.g. "
                            f"math_answer_reward (got {correctness!r})")
        self.correctness, self.threshold, self.group_column = correctness, threshold, group_column

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                 **columns: Any) -> list[float]:
        scores = list(self.correctness(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                       **columns))
        if len(scores) != len(completions):
            raise ValueError(f"the correctness function returned {len(scores)} scores for {len(completions)} completions")
        lengths = [len(ids) for ids in completion_ids]
        out = [0.0] * len(completions)
        for members in self._groups(prompts, columns).values():
            lo, hi = min(lengths[i] for i in members), max(lengths[i] for i in members)
            for i in members:
                lam = 0.0 if hi == lo else 0.5 - (lengths[i] - lo) / (hi - lo)
                out[i] = lam if scores[i] >= self.threshold else min(0.0, lam)
        return out

    def _groups(self, prompts: Sequence[Any], columns: dict[str, Any]) -> dict[Any, list[int]]:
        texts = [p if isinstance(p, str) else repr(p) for p in prompts]  # conversations are lists
        # with the prompt in the key, two sources of a mixture that share an index stay apart
        tags = columns.get(self.group_column) if self.group_column else None
        keys = list(zip(tags, texts)) if tags is not None else texts
        groups: dict[Any, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        return groups
