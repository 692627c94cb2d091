"""SAPO: PPO's hard clip replaced by a smooth, temperature-controlled gate on the token ratio."""
from __future__ import annotations

import torch

from ..numerics import safe_ratio
from .base import POLICY_LOSSES, Stats, per_token


@POLICY_LOSSES.register("sapo")
def sapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature_pos: float = 1.0,
    temperature_neg: float = 1.05,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """``loss_t = -f(r_t)·A``, ``f(r) = σ(τ (r - 1))·4/τ``, ``r_t = π/π_old``, τ by the sign of A.

    Gao et al., "Soft Adaptive Policy Optimization", arXiv 2511.20347. ``τ = temperature_pos``
    where ``A > 0``, else ``temperature_neg`` (the paper's and TRL's 1.0 / 1.05). The gradient
    is ``-A·4σ(1-σ)·r·∇logπ``: at ``r = 1`` it is the plain policy gradient, and it fades
    smoothly as the ratio leaves 1 instead of dropping to 0 at a clip edge; a larger τ fades
    faster, so ``τ_neg > τ_pos`` damps negative-advantage tokens more (the paper's reason:
    they raise the logits of many unsampled tokens). No clip range: the module's ``clip_low``/
    ``clip_high`` are not used. Aggregate with ``seq-mean-token-mean`` (the paper's objective,
    TRL's, and the default ``grpo`` preset's).

    Args:
        temperature_pos: τ for tokens with positive advantage (TRL ``sapo_temperature_pos``).
        temperature_neg: τ for tokens with non-positive advantage (TRL ``sapo_temperature_neg``).

    Stats: ``sapo/gate_weight`` (``4σ(1-σ)``: the factor on the token's unclipped gradient).
    """
    if temperature_pos <= 0 or temperature_neg <= 0:
        raise ValueError(f"sapo's temperatures must be > 0 (got temperature_pos={temperature_pos}, "
                         f"temperature_neg={temperature_neg}); the paper uses 1.0 and 1.05")
    adv = per_token(advantages, logprobs)
    # tensors of the log-probs' dtype: python scalars in torch.where would round τ to float32
    tau = torch.where(adv > 0, logprobs.new_tensor(temperature_pos), logprobs.new_tensor(temperature_neg))
    gate = torch.sigmoid(tau * (safe_ratio(logprobs - old_logprobs) - 1.0))
    return -gate * (4.0 / tau) * adv, {"sapo/gate_weight": (4.0 * gate * (1.0 - gate)).detach()}
