"""Group-relative baselines: GRPO, Dr. GRPO and RLOO (signature in `base`)."""
from __future__ import annotations

import torch

from .base import ADVANTAGE_ESTIMATORS
from .inputs import AdvantageInputs


@ADVANTAGE_ESTIMATORS.register("grpo", group_relative=True)
def grpo_advantage(inputs: AdvantageInputs, *, eps: float = 1e-6, std_unbiased: bool = True,
                   **_: object) -> torch.Tensor:
    """GRPO: ``A = (r - mean_g) / (std_g + eps)``.

    Shao et al., "DeepSeekMath", arXiv 2402.03300. The paper does not say which standard
    deviation; ``std_unbiased=True`` (Bessel's correction) matches TRL and verl.
    A group whose rewards are all equal gets advantage 0.
    """
    rewards = inputs.rewards
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=std_unbiased)
    return (rewards - mean) / (std + eps)


@ADVANTAGE_ESTIMATORS.register("dr_grpo", group_relative=True)
def dr_grpo_advantage(inputs: AdvantageInputs, **_: object) -> torch.Tensor:
    """Dr. GRPO: ``A = r - mean_g`` (no std division, which over-weights easy/hard prompts).

    Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783.
    """
    rewards = inputs.rewards
    return rewards - rewards.mean(dim=1, keepdim=True)


@ADVANTAGE_ESTIMATORS.register("rloo", group_relative=True)
def rloo_advantage(inputs: AdvantageInputs, **_: object) -> torch.Tensor:
    """RLOO: each sample's baseline is the mean of the *other* G-1 rewards.

    Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
    Human Feedback in LLMs", arXiv 2402.14740. ``r_i - (Σ_j r_j - r_i)/(G-1)``.
    """
    rewards = inputs.rewards
    g = rewards.shape[1]
    return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)
