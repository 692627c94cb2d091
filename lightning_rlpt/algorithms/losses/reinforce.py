"""REINFORCE-form policy losses (``-weight · A · logπ``): CISPO and RGRA / plain REINFORCE.

Unlike PPO's clipped surrogate, no token's gradient is ever dropped: CISPO only bounds the
(detached) importance weight, RGRA has none.
"""
from __future__ import annotations

import torch

from ..numerics import safe_ratio
from .base import POLICY_LOSSES, Stats, per_token


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_lower: bool = False,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """CISPO: ``loss_t = -sg(clip(r_t, lower, 1 + clip_high)) · A · logπ_t``, ``r_t = π/π_old``.

    MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
    arXiv 2506.13585. Clipping the IS weight instead of the update keeps the gradient of rare
    high-ratio ("fork") tokens that PPO's clip would zero. The paper imposes no lower bound
    (``lower = 0``, the default here, ``clip_low`` unused); ``clip_lower=True`` floors the
    weight at ``1 - clip_low``. The ``cispo`` preset uses ``clip_high = 0.28`` (DAPO's
    clip-higher; the paper tunes ε_high and its value is an open choice) and ``token-mean``.

    ``clip_high`` is relative, the cap is ``1 + clip_high``, as for every clipped loss here. TRL's
    ``epsilon_high`` for ``loss_type="cispo"`` is the cap itself (``GRPOTrainer._compute_loss``
    clamps the ratio at ``epsilon_high``; ScaleRL's ε_max, recommended 5.0), so
    TRL's ``epsilon_high=5.0`` is ``clip_high=4.0`` here. TRL counts only positive-advantage tokens
    in its ``cispo_clip_ratio``; ``clip_ratio/high`` counts every sign.

    Stats: ``clip_ratio/high`` (weight truncated at ``1 + clip_high``, any advantage sign),
    ``clip_ratio/low`` (floored; 0 unless ``clip_lower``), ``clip_ratio/region`` (either).
    """
    adv = per_token(advantages, logprobs)
    ratio = safe_ratio(logprobs.detach() - old_logprobs.detach())
    lower = 1.0 - clip_low if clip_lower else 0.0
    weight = ratio.clamp(lower, 1.0 + clip_high)
    high = (ratio > 1.0 + clip_high).to(logprobs.dtype)
    low = (ratio < lower).to(logprobs.dtype)
    return -adv * weight * logprobs, {"clip_ratio/low": low, "clip_ratio/high": high, "clip_ratio/region": low + high}


def reinforce_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """RGRA / REINFORCE: ``loss_t = -A · logπ_t`` (no ratio, no clipping).

    Carrino et al., "Are complicated loss functions necessary for teaching LLMs to reason?",
    arXiv 2603.18756 (RGRA: REINFORCE with group-relative advantages; the KL term is kept);
    Williams 1992 for REINFORCE. Registered as ``rgra`` and ``reinforce``: the same loss, the
    advantage estimator decides the baseline. Valid on-policy only: with
    ``updates_per_rollout > 1`` (or several mini-batches) later steps train on stale samples
    without any correction; `presets.check_objective` refuses the first case. Logs no stats.
    """
    return -per_token(advantages, logprobs) * logprobs, {}


POLICY_LOSSES.register("rgra", on_policy_only=True)(reinforce_loss)
POLICY_LOSSES.register("reinforce", on_policy_only=True)(reinforce_loss)
