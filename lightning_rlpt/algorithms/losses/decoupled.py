"""Decoupled PPO with the A-3PO proximal-policy approximation (asynchronous / stale rollouts).

Decoupled PPO separates the two jobs of ``π_old``: the off-policy correction uses the
behaviour policy that sampled the tokens, the trust region a recent "proximal" policy.
"""
from __future__ import annotations

import torch

from ..numerics import safe_ratio
from .base import POLICY_LOSSES, Stats
from .ppo import ppo_clip_loss

PROXIMAL_MODES = ("a3po", "recomputed")


def needs_behaviour_logprobs(name: str, behaviour_logprobs: torch.Tensor | None) -> None:
    if behaviour_logprobs is None:
        raise ValueError(
            f"policy loss {name!r} needs the rollout engine's behaviour log-probs, but the experience has none "
            "(experience.behaviour_logprobs is None). Add a rollout engine that reports them, e.g. the VLLMRollout "
            "callback, or build the module with RLModule(..., rollout_logprobs=True)")


def a3po_alpha(staleness: int | float | torch.Tensor, proximal_lag: int, like: torch.Tensor) -> torch.Tensor:
    """``α = (v_prox - v_behav) / (v_θ - v_behav)`` with ``v_θ - v_behav = staleness`` and
    ``v_θ - v_prox = proximal_lag``; α = 0 (proximal = behaviour) when ``staleness <= lag``."""
    s = torch.as_tensor(staleness, dtype=like.dtype, device=like.device)
    if (s < 0).any():
        raise ValueError(f"staleness must be >= 0 (got {staleness}): the rollout engine reports a policy version "
                         "newer than the module's")
    s = s.unsqueeze(-1) if s.dim() == 1 else s  # one staleness per sequence
    return torch.where(s > 0, (s - proximal_lag).clamp(min=0) / s.clamp(min=1), torch.zeros_like(s))


@POLICY_LOSSES.register("decoupled_ppo", self_correcting=True)
def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    staleness: int | float | torch.Tensor = 0,
    proximal: str = "a3po",
    proximal_lag: int = 1,
    behaviour_weight_cap: float | None = None,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """``loss_t = sg(π_prox/π_behav) · max(-A r_t, -A clip(r_t, 1 - clip_low, 1 + clip_high))``,
    ``r_t = π_θ/π_prox``.

    Decoupled PPO: Hilton, Cobbe & Schulman, "Batch size-invariance for policy optimization",
    arXiv 2110.00641; used for asynchronous RL by AReaL (Fu et al., arXiv 2505.24298).
    A-3PO: Li, Wu & Shen, "A-3PO: Accelerating Asynchronous LLM Training with Staleness-aware
    Proximal Policy Approximation", arXiv 2512.06547, which skips the proximal forward pass::

        log π_prox ≈ log π_behav + α (sg(log π_θ) - log π_behav),
        α = (v_prox - v_behav) / (v_θ - v_behav)

    The module passes ``staleness = v_θ - v_behav`` (its policy version minus the rollout's).
    Open choice: ``v_prox``. Following AReaL's docs the proximal policy is one optimizer step
    behind the current one, ``v_prox = v_θ - proximal_lag`` with ``proximal_lag = 1``, so
    ``α = max(s - lag, 0)/s``: a rollout at most ``lag`` steps old uses the behaviour policy
    as its proximal one (plain PPO against ``π_behav``, weight 1).
    ``proximal="recomputed"`` uses the learner's recomputed rollout-time log-probs
    (``old_logprobs``: recomputed when the rollout is reused, else the detached current ones,
    which at μ = 1 are the same numbers) instead.
    ``behaviour_weight_cap``: tokens whose weight exceeds it are dropped (AReaL's
    ``behav_imp_weight_cap``); None keeps all.

    The weight already corrects for the behaviour policy: run it with
    ``rollout_correction=None`` (`presets.check_objective` refuses the double correction).

    Raises:
        ValueError: without behaviour log-probs (the engine must report them).

    Stats: those of `ppo_clip_loss` and ``decoupled/behaviour_weight`` (``π_prox/π_behav``).
    """
    needs_behaviour_logprobs("decoupled_ppo", behaviour_logprobs)
    if proximal not in PROXIMAL_MODES:
        raise ValueError(f"unknown proximal mode {proximal!r}; known: {', '.join(PROXIMAL_MODES)}")
    behav = behaviour_logprobs.to(logprobs.dtype)
    if proximal == "a3po":
        prox = behav + a3po_alpha(staleness, proximal_lag, logprobs) * (logprobs.detach() - behav)
    else:
        prox = old_logprobs.detach()
    weight = safe_ratio(prox - behav) * mask
    if behaviour_weight_cap is not None:
        weight = weight * (weight <= behaviour_weight_cap).to(weight.dtype)
    loss, stats = ppo_clip_loss(logprobs, prox, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                                dual_clip=dual_clip)
    stats["decoupled/behaviour_weight"] = weight
    return loss * weight, stats
