"""Policy gradient on the high-entropy minority only (TRL's ``top_entropy_quantile``).

Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning" (arXiv 2506.01939), keep in DAPO's objective only the
tokens whose entropy ``H_t`` reaches the batch's threshold ``τ_ρ^B``, the entropy above which
lies a fraction ``ρ`` of the batch's tokens:

    J = E[ 1/Σ_i|o_i| · Σ_i Σ_t 1[H_t^i ≥ τ_ρ^B] · min(r A, clip(r) A) ]

So, as in the paper and in TRL:

- ``H_t`` is the entropy of the *current* policy (at the sampling temperature) at the
  position, detached: the mask selects tokens, it carries no gradient;
- the threshold is the ``1 - ρ`` quantile (linear interpolation, as ``torch.quantile``) of
  the entropies of every trained token of the batch, on every data-parallel rank; padding and
  masked (e.g. truncated) tokens take no part;
- the indicator multiplies the policy-gradient term only: the KL term still covers every
  token, and the aggregation denominators (``Σ_i|o_i|``, sequence counts) are unchanged.

"The batch" is the optimizer step's mini-batch (see `stages.update`); TRL takes one gradient-
accumulation micro-batch, which is the same thing when it accumulates nothing.
"""
from __future__ import annotations

from typing import Callable

import torch


def check_top_entropy_quantile(rho: float) -> None:
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0 < rho <= 1:
        raise ValueError(f"top_entropy_quantile must be in (0, 1]: the fraction of highest-entropy tokens that get "
                         f"policy gradient (got {rho!r}); 1.0 trains on every token, the paper uses 0.2")


def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(values, q)`` (linear interpolation) without its input-size limit."""
    ordered = values.flatten().sort().values
    position = q * (ordered.numel() - 1)
    low = int(position)
    high = min(low + 1, ordered.numel() - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def entropy_threshold(entropy: torch.Tensor, mask: torch.Tensor, rho: float,
                      gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """``τ_ρ``: the ``1 - rho`` quantile of the entropies of the tokens where ``mask`` is set.

    Args:
        entropy: ``[N, C]`` per-token entropies.
        mask: ``[N, C]`` the trained tokens (1) and the rest (0).
        rho: the fraction of tokens to keep, in (0, 1].
        gather: maps this rank's 1-D entropies to every rank's (None: one process).

    Returns a 0-dim tensor; ``+inf`` (no token kept) when no rank has a trained token.

    Examples:
        >>> e = torch.tensor([[0.1, 0.5, 0.9], [0.7, 0.3, 9.0]]); m = torch.tensor([[1, 1, 1], [1, 1, 0]])
        >>> round(entropy_threshold(e, m, 0.5).item(), 4)  # the median of 0.1 0.3 0.5 0.7 0.9
        0.5
    """
    values = entropy.detach().float()[mask.bool()]
    if gather is not None:
        values = gather(values)
    if values.numel() == 0:
        return torch.tensor(float("inf"), device=entropy.device)
    return quantile(values, 1.0 - rho).to(entropy.device)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, threshold: torch.Tensor | float) -> torch.Tensor:
    """``[N, C]`` float: 1 where ``mask`` is set and the entropy reaches ``threshold``.

    Examples:
        >>> e = torch.tensor([[0.1, 0.5, 0.9], [0.7, 0.3, 9.0]]); m = torch.tensor([[1, 1, 1], [1, 1, 0]])
        >>> high_entropy_mask(e, m, 0.5).tolist()
        [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    """
    return ((entropy.detach() >= threshold) & mask.bool()).float()
