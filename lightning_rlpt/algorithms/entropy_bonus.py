"""The entropy bonus (TRL's ``entropy_coef``): ``loss = L_policy - c · H̄``, where ``H̄`` is the mean
per-token entropy of the current policy (at the sampling temperature) over the trained tokens.

As TRL documents it (``GRPOConfig.entropy_coef``, applied in ``GRPOTrainer._compute_loss``), the
bonus is the same token mean whatever the policy term's aggregation ("not rescaled to a loss
type's policy normalization", so ``c`` means the same for every loss): the sum of the
entropies over the whole mini-batch's trained tokens (every rank) divided by their count, the
normaliser of TRL's default ``loss_type="dapo"``. With ``top_entropy_quantile`` < 1 only the
kept high-entropy tokens contribute, and the mean is over them: divided by the kept tokens'
count (TRL 1.16 divides by ``(mask * entropy_mask).sum()``). The
entropy carries gradient (``policy_logprobs(..., entropy_grad=True)``; the fused kernel has its
own entropy backward), so a positive ``c`` pushes the policy toward higher entropy.
"""
from __future__ import annotations

import math

import torch


def check_entropy_coef(coef: float) -> None:
    """``entropy_coef`` must be a finite number (TRL's values are >= 0; a negative one is an entropy penalty)."""
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef):
        raise ValueError(f"entropy_coef must be a finite number (got {coef!r}): the weight of the entropy bonus "
                         "subtracted from the loss, 0 for none (TRL's default); 0.001-0.01 is usual")


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, num_tokens: float,
                  policy_mask: torch.Tensor | None = None) -> torch.Tensor:
    """This micro-batch's share of the mini-batch's mean token entropy: ``Σ H · mask / num_tokens``.

    Args:
        entropy: ``[N, C]`` per-token entropies, with grad.
        mask: ``[N, C]`` the trained tokens.
        num_tokens: the mini-batch's tokens the bonus acts on, over every rank: the trained tokens,
            or with ``policy_mask`` the kept ones (the shares then add up, over micro-batches and
            ranks, to the mean).
        policy_mask: the tokens that keep the policy-gradient term (``top_entropy_quantile``), or None.

    Examples:
        >>> h = torch.tensor([[1.0, 3.0], [2.0, 9.0]]); m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
        >>> entropy_bonus(h, m, num_tokens=3).item()
        2.0
    """
    kept = mask if policy_mask is None else mask * policy_mask
    return (entropy.to(torch.promote_types(entropy.dtype, torch.float32)) * kept).sum() / max(float(num_tokens), 1.0)
