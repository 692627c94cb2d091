"""Objective presets: a name fills in the policy loss, advantage estimator, aggregation, clip
ranges and KL coefficient. Any explicit `RLModule` argument overrides the preset.

- ``grpo`` (Shao et al., arXiv 2402.03300): group mean/std advantages, PPO clip ±0.2,
  ``seq-mean-token-mean``, β = 0.04 as in the paper.
- ``dapo`` (Yu et al., arXiv 2503.14476): clip-higher (0.2, 0.28), dual clip 10 on negative
  advantages, ``token-mean``, no KL. Dynamic sampling and overlong shaping are callbacks.
- ``dr_grpo`` (Liu et al., arXiv 2503.20783): mean-only advantages, ``seq-mean-token-sum-norm``
  (divide by the generation budget), no KL.

A bare policy-loss name (any key of `POLICY_LOSSES`, e.g. ``"ppo_clip"``) takes the ``grpo``
preset with that loss.
"""
from __future__ import annotations

from typing import Any

from .policy_losses import POLICY_LOSSES

PRESETS: dict[str, dict[str, Any]] = {
    "grpo": dict(policy_loss="ppo_clip", advantage="grpo", loss_aggregation="seq-mean-token-mean",
                 clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.04),
    "dapo": dict(policy_loss="ppo_clip", advantage="grpo", loss_aggregation="token-mean",
                 clip_low=0.2, clip_high=0.28, dual_clip=10.0, kl_coef=0.0),
    "dr_grpo": dict(policy_loss="ppo_clip", advantage="dr_grpo", loss_aggregation="seq-mean-token-sum-norm",
                    clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.0),
}


def resolve_objective(objective: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The preset for ``objective`` with every non-None override applied."""
    if objective in PRESETS:
        settings = dict(PRESETS[objective])
    elif objective in POLICY_LOSSES:
        settings = {**PRESETS["grpo"], "policy_loss": objective}
    else:
        raise ValueError(f"unknown objective {objective!r}; presets: {', '.join(PRESETS)}; "
                         f"policy losses: {', '.join(POLICY_LOSSES.names())}")
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return settings
