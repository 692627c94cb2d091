"""``future_k1``: the sequence-level reverse-KL gradient through a KL return-to-go (FRPO style)."""
from __future__ import annotations

import torch

from .kl import KL_ESTIMATORS


@KL_ESTIMATORS.register("future_k1")
def future_k1_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per token ``sg(Σ_{s≥t} δ_s) · π_t/sg(π_old_t)`` with ``δ = logπ - logπ_ref`` (masked).

    Tang & Munos, "On a few pitfalls in KL divergence gradient estimation for RL",
    arXiv 2506.09477 (see also Liu et al., arXiv 2510.01555): the gradient of the *sequence*
    reverse KL ``KL(π(y)‖π_ref(y))`` is ``E[Σ_t ∇logπ(y_t) Σ_{s≥t} δ_s]`` — each token is
    charged the KL of everything it leads to, not only its own ``δ_t`` (the per-token ``k1``,
    which drops the future terms). Summed over the tokens of a sequence sampled on-policy,
    this loss's gradient is exactly that, so aggregate it with a token *sum*
    (``seq-mean-token-sum``, or ``seq-mean-token-sum-norm`` up to a constant); a token mean
    divides each sequence's gradient by its length. Off-policy (``updates_per_rollout > 1``)
    the per-token ratio ``π_t/π_old_t`` is not the full prefix correction, so it is approximate there.
    """
    delta = (logprobs - ref_logprobs).detach()
    if mask is not None:
        delta = delta * mask.to(delta.dtype)  # padding adds nothing to any return-to-go
    to_go = delta.flip(-1).cumsum(-1).flip(-1)
    return to_go * torch.exp(logprobs - old_logprobs.detach())
