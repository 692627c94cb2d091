"""``multi_objective_aggregation`` (TRL's name and values): ``normalize_then_sum`` (GDPO) normalises
each reward function within its group, skipping None, before the weighted sum. By hand, against
TRL's code on the same scores (with TRL's final batch normalisation, which here is the
``grpo_batch_std`` advantage), through `score_experience` (scores stay the raw sum: what success and
the logged reward read), and bad values refused."""
import math

import pytest
import torch

import tiny_task as task
from lightning_rlpt import RLModule
from lightning_rlpt.rewards import RewardFunctions
from lightning_rlpt.rewards import score_experience
from lightning_rlpt.rollout import collect
from trl_formulas import nanstd

NAN = math.nan


def _gdpo(weights=(1.0, 0.5)):
    noop = [lambda prompts, completions, **_: [0.0] * len(completions) for _ in weights]
    return RewardFunctions(noop, list(weights), aggregation="normalize_then_sum")


def test_normalize_then_sum_by_hand():
    """Group 1: A = [1, 0, None] (mean 1/2, std √½), B = [2, 4, 6] (mean 4, std 2); group 2: A
    applies to one sample only (its std is undefined: A adds nothing), B = [1, 1, 1] (std 0)."""
    scores = torch.tensor([[1.0, 2.0], [0.0, 4.0], [NAN, 6.0],
                           [5.0, 1.0], [NAN, 1.0], [NAN, 1.0]])
    a, b = 0.5 / (math.sqrt(0.5) + 1e-4), 2.0 / (2.0 + 1e-4)
    expected = [a - 0.5 * b, -a, 0.5 * b, 0.0, 0.0, 0.0]
    assert _gdpo().aggregate(scores, 3).tolist() == pytest.approx(expected, rel=1e-6)
    assert _gdpo().combine(scores).tolist() == pytest.approx([2.0, 2.0, 3.0, 5.5, 0.5, 0.5])  # raw sum unchanged


def test_group_size_one_gives_zero_as_trl():
    assert _gdpo().aggregate(torch.tensor([[3.0, 1.0], [1.0, NAN]]), 1).tolist() == [0.0, 0.0]


def test_sum_then_normalize_is_the_weighted_sum():
    rf = RewardFunctions([lambda p, c, **_: [0.0] * len(c)] * 2, [1.0, 0.5])
    scores = torch.tensor([[1.0, 2.0], [NAN, 4.0]])
    assert rf.aggregate(scores, 2).tolist() == [2.0, 2.0]


def _trl_normalize_then_sum(rewards_per_func, weights, num_generations):
    """trl/trainer/grpo_trainer.py, ``GRPOTrainer._generate_and_score_completions``, branch
    ``multi_objective_aggregation == "normalize_then_sum"``, transcribed: (the summed rewards,
    the advantages)."""
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
    reward_k = (grouped - mean_k) / (std_k + 1e-4)
    reward_k = reward_k.view(-1, rewards_per_func.shape[1])
    rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    return rewards, torch.nan_to_num(advantages, nan=0.0)


def test_equals_trls_normalize_then_sum_on_the_same_scores():
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(24, 3, generator=g) * torch.tensor([1.0, 10.0, 0.1])
    scores[torch.rand(24, 3, generator=g) < 0.25] = NAN
    scores[:, 0] = torch.where(torch.isnan(scores).all(dim=1), 1.0, scores[:, 0])  # every sample scored
    weights = torch.tensor([1.0, 0.3, 2.0])
    rf = RewardFunctions([lambda p, c, **_: [0.0] * len(c)] * 3, weights.tolist(), aggregation="normalize_then_sum")
    summed, trl_advantages = _trl_normalize_then_sum(scores, weights, 4)
    ours = rf.aggregate(scores, 4)
    torch.testing.assert_close(ours, summed)
    # TRL's last step (batch mean, batch std) is the same as the group mean and the batch std, which
    # the ``grpo_batch_std`` advantage takes: the GDPO sum's group mean is 0
    group_mean = ours.view(-1, 4).mean(1).repeat_interleave(4)
    assert group_mean.abs().max() < 1e-5
    torch.testing.assert_close((ours - group_mean) / (ours.std() + 1e-4), trl_advantages)


def test_score_fills_gdpo_rewards_and_keeps_the_raw_sum_as_scores(warm_start_dir, arithmetic_rows):
    def length(prompts, completions, **_):
        return [float(len(c)) if i % 2 else None for i, c in enumerate(completions)]

    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer, length], reward_weights=[1.0, 0.1],
                      multi_objective_aggregation="normalize_then_sum", group_size=4, kl_coef=0.0,
                      generation=dict(max_new_tokens=4, max_prompt_length=8), seed=0)
    batch = dict(prompt=[r["prompt"] for r in arithmetic_rows[:3]], answer=[r["answer"] for r in arithmetic_rows[:3]])
    exp, _ = collect.rollout(module.engine, module.tokenizer, batch, 4, module.sampling, 1, "cpu")
    score_experience(exp, module.rewards)
    per_func = exp.rewards_per_func
    torch.testing.assert_close(exp.scores, torch.nansum(per_func * torch.tensor([1.0, 0.1]), dim=1))
    torch.testing.assert_close(exp.rewards, module.rewards.aggregate(per_func, 4))
    assert exp.rewards.view(-1, 4).sum(1).abs().max() < 1e-4  # each group's GDPO sum has mean 0
    assert not torch.allclose(exp.rewards, exp.scores)


def test_an_unknown_aggregation_is_refused_naming_the_values():
    with pytest.raises(ValueError, match=r"multi_objective_aggregation must be one of \['sum_then_normalize', "
                                         r"'normalize_then_sum'\] \(got 'gdpo'\)"):
        RewardFunctions([task.exact_answer], aggregation="gdpo")
