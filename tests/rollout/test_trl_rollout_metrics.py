"""TRL's rollout metrics with TRL's meanings, by hand: ``reward_std`` over the whole batch (TRL's
``nanstd(rewards)``, Bessel-corrected), the per-group mean under its own name, and the lengths of
the completions that ended with EOS (TRL's ``_generate_and_score_completions``, trl/trainer/
grpo_trainer.py: ``completions/*_terminated_length``, 0 when none ended)."""
import math

import pytest
import torch

from lightning_rlpt.rollout.collect import length_metrics, rollout_metrics


def _metrics(rewards, group_size=4):
    rewards = torch.tensor(rewards)
    n = len(rewards)
    return rollout_metrics(rewards, rewards.unsqueeze(1), torch.full((n,), 3), torch.zeros(n, dtype=torch.bool),
                           group_size, ["r"], torch.zeros(1))


def test_reward_std_is_the_batch_std_and_the_group_mean_has_its_own_name():
    metrics = _metrics([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    # batch: mean 5/8; squared deviations 5·(3/8)² + 3·(5/8)² = 1.875; Bessel: / 7
    assert metrics["reward_std"] == pytest.approx(math.sqrt(1.875 / 7))
    # groups: std(1, 0, 0, 0) = sqrt(0.75 / 3) = 0.5 and std(1, 1, 1, 1) = 0
    assert metrics["reward_group_std"] == pytest.approx(0.25)
    assert metrics["frac_reward_zero_std"] == 0.5
    assert metrics["reward"] == pytest.approx(5 / 8)


def test_every_group_constant_but_the_batch_not_gives_a_batch_std_and_no_group_spread():
    """The case the two meanings part most: GRPO learns nothing (every group std 0), while TRL's
    ``reward_std`` still shows the spread between prompts."""
    metrics = _metrics([2.0, 2.0, 0.0, 0.0], group_size=2)
    assert metrics["reward_group_std"] == 0.0 and metrics["frac_reward_zero_std"] == 1.0
    assert metrics["reward_std"] == pytest.approx(math.sqrt(4.0 / 3))  # deviations ±1, 4 samples


def test_terminated_lengths_are_over_the_completions_that_ended_with_eos():
    metrics = length_metrics(torch.tensor([3, 5, 2, 4]), torch.tensor([False, True, False, True]))
    assert metrics["completions/mean_terminated_length"] == 2.5  # (3 + 2) / 2
    assert metrics["completions/min_terminated_length"] == 2.0
    assert metrics["completions/max_terminated_length"] == 3.0
    assert metrics["completions/mean_length"] == 3.5 and metrics["completions/max_length"] == 5.0
    assert metrics["completions/clipped_ratio"] == 0.5


def test_terminated_lengths_are_zero_when_no_completion_ended():
    metrics = length_metrics(torch.tensor([4, 4]), torch.tensor([True, True]))
    assert [metrics[f"completions/{k}_terminated_length"] for k in ("mean", "min", "max")] == [0.0, 0.0, 0.0]
    assert metrics["completions/clipped_ratio"] == 1.0
