"""`score_experience`: the reward functions run over a rollout, their results written into its
`Experience` (step 3 of the walk in docs/architecture.md; the experience stage and validation call it)."""
from __future__ import annotations

from typing import Any

from ..batching import row_lengths
from ..experience import Experience
from .functions import RewardFunctions, as_trl_completions


def score_experience(exp: Experience, rewards: RewardFunctions, trainer_state: Any = None) -> dict[str, int]:
    """Fill ``rewards_per_func`` (NaN where a function returned None), ``scores`` (their weighted
    sum over the functions that apply) and ``rewards`` (what advantages come from: ``scores``, or
    GDPO's sum under ``normalize_then_sum``, `RewardFunctions.aggregate`); return failures per function.

    The functions get what TRL's ``GRPOTrainer`` passes: ``prompts`` as given, ``completions``
    as messages (``[{"role": "assistant", "content": text}]``) when the prompts are
    conversational and as strings otherwise, ``completion_ids`` (EOS kept when sampled),
    ``trainer_state`` (when given) and every dataset column.
    """
    # Every token up to the last trained one (an episode's tool tokens included, padding not).
    ends = row_lengths(exp)[1].tolist()
    ids = [row[:end].tolist() for row, end in zip(exp.completion_ids.cpu(), ends)]
    extra: dict[str, Any] = {"completion_ids": ids}
    if trainer_state is not None:
        extra["trainer_state"] = trainer_state
    completions = as_trl_completions(exp.prompts, exp.completions)
    if "completion_messages" in exp.columns and completions and not isinstance(completions[0], str):
        completions = list(exp.columns["completion_messages"])  # an episode: every message after the prompt
    per_func, failures = rewards(exp.prompts, completions, exp.columns, **extra)
    exp.rewards_per_func = per_func.to(exp.completion_ids.device)
    exp.scores = rewards.combine(exp.rewards_per_func)
    exp.rewards = rewards.aggregate(exp.rewards_per_func, exp.group_size)
    return failures
