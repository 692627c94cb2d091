"""Group mean, batch standard deviation: TRL's ``scale_rewards="batch"`` (signature in `base`).

The std is over the whole batch of *every* data-parallel rank: each rank holds only its own
prompts' groups, so the estimator takes ``sum_over_ranks``, which the module supplies
(`MakeExperience`: `model.distributed.reduce_over_ranks` with its trainer). Two sums cross the
ranks: (count, Σ r) for the mean, then Σ (r - mean)² for the variance, both in float64.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from .base import ADVANTAGE_ESTIMATORS
from .inputs import AdvantageInputs

SumOverRanks = Callable[[Sequence[float]], list[float]]


def batch_std(values: torch.Tensor, unbiased: bool, sum_over_ranks: SumOverRanks | None = None) -> float:
    """The standard deviation of ``values`` pooled with every rank's (``sum_over_ranks``: sums a
    list of floats over the ranks; None: this process only). 0 for fewer than two values."""
    flat = values.detach().reshape(-1).double()
    total = sum_over_ranks or (lambda xs: list(xs))
    count, summed = total([float(flat.numel()), float(flat.sum())])
    if count < 2:
        return 0.0
    squares = total([float(((flat - summed / count) ** 2).sum())])[0]
    return math.sqrt(squares / (count - 1 if unbiased else count))


@ADVANTAGE_ESTIMATORS.register("grpo_batch_std", group_relative=True)
def grpo_batch_std_advantage(inputs: AdvantageInputs, *, eps: float = 1e-6, std_unbiased: bool = True,
                             sum_over_ranks: SumOverRanks | None = None, **_: object) -> torch.Tensor:
    """``A = (r - mean_g) / (std_B + eps)``: the group's mean, the whole batch's std.

    Liu et al., "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning", arXiv
    2508.08221 (group-level mean, batch-level std; their "Lite PPO"); TRL's
    ``scale_rewards="batch"``. The batch std is of the raw rewards of all ranks' groups, so a
    group whose rewards are all equal still gets 0 and a prompt's advantages are not inflated
    because its own group happens to agree (GRPO's per-group std does that).

    Args:
        eps: added to the std (TRL uses 1e-4; ``grpo`` here 1e-6).
        std_unbiased: Bessel's correction over the N·G rewards, as TRL.
        sum_over_ranks: supplied by the module (never an ``advantage_kwargs`` key): sums a list
            of floats over the data-parallel ranks. None: the batch is this process's.
    """
    rewards = inputs.rewards
    std = batch_std(rewards, std_unbiased, sum_over_ranks)
    return (rewards - rewards.mean(dim=1, keepdim=True)) / (std + eps)
