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
  *forward* KL ``KL(π_ref‖π)``, a biased surrogate for the reverse KL. It is TRL's default KL
  term (``GRPOConfig(use_bias_correction_kl=False)``).
- ``k3_ratio``: ``k3 · π/sg(π_old)``, TRL's ``use_bias_correction_kl=True`` (DeepSeek-V3.2,
  arXiv 2512.02556). Its value is an unbiased estimate of ``KL(π‖π_ref)`` off-policy too; its
  gradient is exactly ``k1``'s, token by token (see `k3_ratio_loss`).

- ``k3_seq_ratio``: ``k3 · s``, ``s`` the *sequence's* differentiable ratio
  ``exp(mean_t log(π/π_old))``: TRL's ``use_bias_correction_kl=True`` under
  ``importance_sampling_level="sequence"`` (GSPO), where TRL's ratio is the sequence's.

- ``future_k1``: the sequence-level reverse-KL gradient through a KL return-to-go (FRPO style).

The module logs ``kl`` as the token mean of `kl_metric`: k3's *value*, a non-negative unbiased
estimate of ``KL(π‖π_ref)`` on the rollout, times the ratio for the ratio-corrected estimators
(TRL logs the KL term it adds, bias correction included).
Every estimator has the signature ``fn(logprobs, ref_logprobs, old_logprobs, mask) -> [N, C]``
(``mask`` lets sequence-level modes such as a future-KL return-to-go ignore padding); register
new ones with ``@KL_ESTIMATORS.register(name)``.
"""
from __future__ import annotations

import torch

from ..registry import Registry
from .numerics import clamp_log_ratio, safe_ratio

KL_ESTIMATORS: Registry = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def k1_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    ratio = safe_ratio(logprobs - old_logprobs.detach())  # clamped: a stale row's exp would overflow
    return (logprobs - ref_logprobs).detach() * ratio


@KL_ESTIMATORS.register("k2")
def k2_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def k3_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    d = clamp_log_ratio(ref_logprobs - logprobs)
    return torch.exp(d) - d - 1.0


@KL_ESTIMATORS.register("k3_ratio")
def k3_ratio_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per token ``k3 · ρ`` with ``ρ = π/sg(π_old)``: TRL's bias-corrected KL term.

    TRL, ``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss``: with
    ``use_bias_correction_kl=True`` the per-token k3 is multiplied by the importance ratio
    ``coef_1`` (DeepSeek-AI, "DeepSeek-V3.2", arXiv 2512.02556). Equal to TRL's term for
    ``importance_sampling_level="token"`` (its default) and ``|δ| ≤ 20`` (k3's clamp); with
    ``"sequence"`` TRL multiplies by the sequence's ratio instead.

    Value: ``E_{π_old}[ρ·k3] = E_π[k3] = KL(π‖π_ref)``, so it stays unbiased when the samples
    come from an older policy (``updates_per_rollout > 1``); on-policy it equals ``k3``.
    Gradient: ``ρ(1 - π_ref/π)∇logπ + k3·ρ∇logπ = ρ·δ·∇logπ``, which is ``k1``'s gradient
    exactly, per token, not only in expectation: the two differ in the value they add to the
    loss (``k1``'s is ``ρ·δ``), never in the update. Their expected gradient is that of the
    reverse KL, on- and off-policy.
    """
    ratio = safe_ratio(logprobs - old_logprobs.detach())  # clamped as k3's own exponent: finite far off-policy
    return k3_loss(logprobs, ref_logprobs, old_logprobs) * ratio


@KL_ESTIMATORS.register("k3_seq_ratio")
def k3_seq_ratio_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per token ``k3 · s`` with ``s = exp(Σ_t mask·log(π/sg(π_old)) / |y|)``, differentiable.

    TRL's ``use_bias_correction_kl=True`` at ``importance_sampling_level="sequence"`` multiplies k3
    by the same length-normalised sequence ratio GSPO clips (DeepSeek-AI, "DeepSeek-V3.2",
    arXiv 2512.02556, with GSPO's ratio: Zheng et al., arXiv 2507.18071); its gradient reaches
    every token of the row through ``s``, so even on-policy (``s = 1``) it differs from
    ``k3_ratio``'s. The mean log-ratio is clamped as `safe_ratio` clamps every exponent.
    """
    if mask is None:
        mask = torch.ones_like(logprobs)
    mask = mask.to(logprobs.dtype)
    log_ratio = ((logprobs - old_logprobs.detach()) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return k3_loss(logprobs, ref_logprobs, old_logprobs) * safe_ratio(log_ratio)


# The estimators whose value is k3 times a ratio: the ``kl`` metric is that product, as TRL logs it.
RATIO_CORRECTED = ("k3_ratio", "k3_seq_ratio")


def kl_value(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 value, detached."""
    return k3_loss(logprobs.detach(), ref_logprobs, logprobs.detach())


def kl_metric(estimator: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
              mask: torch.Tensor) -> torch.Tensor:
    """Per-token values of the ``kl`` metric, detached: k3, times the estimator's ratio for
    `RATIO_CORRECTED` ones (TRL logs ``per_token_kl`` after its bias correction)."""
    if estimator in RATIO_CORRECTED:
        return KL_ESTIMATORS.get(estimator)(logprobs.detach(), ref_logprobs, old_logprobs, mask).detach()
    return kl_value(logprobs, ref_logprobs)



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
