"""The per-token training objective of one mini-batch, before aggregation: the selected policy
loss, plus β times the selected KL estimator, times the mismatch correction and the callbacks'
token and sample weights. Pure tensor code: the module supplies the log-probs and knobs."""
from __future__ import annotations

from typing import Any

import torch

from .correction import correction_weights
from .kl import KL_ESTIMATORS
from .losses import POLICY_LOSSES, Stats


def surrogate(mb: Any, logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, *, policy_loss: str,
              kl_estimator: str, kl_coef: float, correction: str | None, correction_cap: float,
              loss_options: dict[str, Any], policy_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Stats]:
    """``(per-token loss [N, C], the policy loss's stats)`` for the mini-batch ``mb`` (an
    `Experience`), with ``logp`` the current log-probs (with grad) and ``old`` π_old's.

    ``loss_options`` go to the policy loss (clip ranges, dual clip, staleness, its own kwargs).
    ``policy_mask`` multiplies the policy-gradient term alone, not the KL term (the high-entropy
    tokens of `entropy_mask`); the loss itself still sees ``mask``, e.g. for sequence ratios.
    """
    per_token, stats = POLICY_LOSSES.get(policy_loss)(logp, old, mb.advantages, mask,
                                                      behaviour_logprobs=mb.behaviour_logprobs, **loss_options)
    if policy_mask is not None:
        per_token = per_token * policy_mask
    if mb.ref_logprobs is not None and kl_coef > 0:
        kl_tok = KL_ESTIMATORS.get(kl_estimator)(logp, mb.ref_logprobs, old, mask)
        kl_w = mb.kl_weights.unsqueeze(-1) if mb.kl_weights is not None else 1.0
        per_token = per_token + kl_coef * kl_w * kl_tok
    if correction is not None and mb.behaviour_logprobs is not None:
        per_token = per_token * correction_weights(old, mb.behaviour_logprobs, mask, correction, correction_cap)
    if mb.token_weights is not None:
        per_token = per_token * mb.token_weights
    if mb.sample_weights is not None:
        per_token = per_token * mb.sample_weights.unsqueeze(-1)
    return per_token, stats
