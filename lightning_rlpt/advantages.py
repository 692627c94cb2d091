"""Advantage estimators: pure functions of the group-shaped rewards, selected by name.

Every estimator has the signature ``fn(rewards, **options) -> advantages`` where ``rewards``
is ``[num_groups, G]`` (row g holds the G completions of prompt g) and the result has the same
shape. Estimators that need a group (all of these) require G ≥ 2; `check_group_size` says so.
Register new ones with ``@ADVANTAGE_ESTIMATORS.register("name")``.
"""
from __future__ import annotations

import torch

from .registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")

GROUP_RELATIVE = {"grpo", "dr_grpo", "rloo"}


def check_group_size(estimator: str, group_size: int) -> None:
    if estimator in GROUP_RELATIVE and group_size < 2:
        raise ValueError(
            f"advantage estimator {estimator!r} compares completions within a group, so it needs "
            f"group_size >= 2 (got {group_size}); set group_size=8 (a common choice) or more"
        )


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantage(rewards: torch.Tensor, *, eps: float = 1e-6, std_unbiased: bool = True,
                   **_: object) -> torch.Tensor:
    """GRPO: ``A = (r - mean_g) / (std_g + eps)``.

    Shao et al., "DeepSeekMath", arXiv 2402.03300. The paper does not say which standard
    deviation; ``std_unbiased=True`` (Bessel's correction) matches TRL and verl.
    A group whose rewards are all equal gets advantage 0.
    """
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=std_unbiased)
    return (rewards - mean) / (std + eps)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantage(rewards: torch.Tensor, **_: object) -> torch.Tensor:
    """Dr. GRPO: ``A = r - mean_g`` (no std division, which over-weights easy/hard prompts).

    Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783.
    """
    return rewards - rewards.mean(dim=1, keepdim=True)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantage(rewards: torch.Tensor, **_: object) -> torch.Tensor:
    """RLOO: each sample's baseline is the mean of the *other* G-1 rewards.

    Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
    Human Feedback in LLMs", arXiv 2402.14740. ``r_i - (Σ_j r_j - r_i)/(G-1)``.
    """
    g = rewards.shape[1]
    return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, **options: object) -> torch.Tensor:
    """Flat ``[N]`` rewards → flat ``[N]`` advantages with the named estimator."""
    grouped = rewards.view(-1, group_size)
    return ADVANTAGE_ESTIMATORS.get(name)(grouped, **options).reshape(-1)


from . import advantages_offpolicy  # noqa: E402,F401  (registers "min_variance_offpolicy")
from . import advantages_zoo  # noqa: E402,F401  (register reinforce_pp, qae, passk)
