"""KL-to-reference estimators and how each enters the loss.

Per token, with ``δ = logπ - logπ_ref`` on a token sampled from the policy:

- ``k1`` (default): a *detached* reward-style term ``sg(δ) · π/sg(π_old)``. Its gradient
  ``sg(δ)·(π/π_old)·∇logπ`` is an importance-weighted sample of ``E_π[δ ∇logπ]``, which is the
  exact gradient of the reverse KL ``KL(π‖π_ref)`` of the token's distribution — on-policy and
  off-policy (``updates_per_rollout > 1``) alike. Chosen as default for that reason (Tang &
  Munos, arXiv 2506.09477; Liu et al., arXiv 2510.01555). Its value equals ``δ`` on-policy.
- ``k2``: the loss ``½δ²``; gradient ``δ ∇logπ``: the same as ``k1`` on-policy, biased once
  the samples come from an older policy.
- ``k3``: the loss ``e^d - d - 1`` with ``d = -δ`` clamped to ±20 (the usual GRPO form,
  Schulman's "k3"); gradient ``(1 - π_ref/π) ∇logπ`` whose expectation is the gradient of the
  *forward* KL ``KL(π_ref‖π)``, a biased surrogate for the reverse KL.

Whatever the estimator, the module logs ``kl`` as the token mean of k3's *value*, a
non-negative unbiased estimate of ``KL(π‖π_ref)`` on the rollout (what TRL logs).
Every estimator has the signature ``fn(logprobs, ref_logprobs, old_logprobs, mask) -> [N, C]``
(``mask`` lets sequence-level modes such as a future-KL return-to-go ignore padding); register
new ones with ``@KL_ESTIMATORS.register(name)``.
"""
from __future__ import annotations

import torch

from .registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def k1_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    ratio = torch.exp(logprobs - old_logprobs.detach())
    return (logprobs - ref_logprobs).detach() * ratio


@KL_ESTIMATORS.register("k2")
def k2_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def k3_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def kl_value(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 value, detached: the ``kl`` metric."""
    return k3_loss(logprobs.detach(), ref_logprobs, logprobs.detach())


from . import kl_future  # noqa: E402,F401  (register future_k1)
