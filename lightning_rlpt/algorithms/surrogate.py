"""The per-token training objective of one mini-batch, before aggregation: the selected policy
loss times the mismatch correction, plus β times the selected KL estimator, times the callbacks'
token and sample weights. Pure tensor code: the module supplies the log-probs and knobs.

The rollout correction (TIS/MIS, `algorithms.correction`) weights the policy-gradient term only,
as TRL (``per_token_loss * importance_sampling_ratio`` before ``+ beta * per_token_kl``) and
verl (``rollout_is_weights`` passed to the policy loss; the KL loss added unweighted) do: the
KL term is a regulariser toward the reference, and a token that MIS masks or TIS truncates
because the engine mis-sampled it should still be pulled back, not freed from the pull.
``correct_kl=True`` weights the KL term too, for the one case that wants it: an estimator whose
gradient is meant to be an exact importance-weighted sample of the reverse KL (``k1``,
``future_k1`` carry ``π/π_old``; the samples come from ``π_behav``, so exactness needs the
``π_old/π_behav`` factor as well).
"""
from __future__ import annotations

from typing import Any

import torch

from .correction import correction_weights
from .kl import KL_ESTIMATORS
from .losses import POLICY_LOSSES, Stats


def surrogate(mb: Any, logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, *, policy_loss: str,
              kl_estimator: str, kl_coef: float, correction: str | None, correction_cap: float,
              loss_options: dict[str, Any], policy_mask: torch.Tensor | None = None,
              correct_kl: bool = False) -> tuple[torch.Tensor, Stats]:
    """``(per-token loss [N, C], the policy loss's stats)`` for the mini-batch ``mb``.

    Args:
        mb: an `Experience` (advantages, behaviour/reference log-probs and the callbacks' weights).
        logp: ``[N, C]`` current log-probs, with grad.
        old: ``[N, C]`` π_old's log-probs.
        mask: ``[N, C]`` the trained tokens.
        policy_loss / kl_estimator: registry names; ``kl_coef`` is β (0: no KL term).
        correction / correction_cap: the rollout-correction mode (None: off) and its cap; applied
            when ``mb`` carries behaviour log-probs, to the policy term only unless ``correct_kl``.
        loss_options: go to the policy loss (clip ranges, dual clip, staleness, its own kwargs).
        policy_mask: multiplies the policy-gradient term alone, not the KL term (the
            high-entropy tokens of `entropy_mask`); the loss itself still sees ``mask``, e.g.
            for sequence ratios.
        correct_kl: multiply the KL term by the correction weights as well (see the module
            docstring for when).
    """
    per_token, stats = POLICY_LOSSES.get(policy_loss)(logp, old, mb.advantages, mask,
                                                      behaviour_logprobs=mb.behaviour_logprobs, **loss_options)
    if policy_mask is not None:
        per_token = per_token * policy_mask
    weights = None
    if correction is not None and mb.behaviour_logprobs is not None:
        weights = correction_weights(old, mb.behaviour_logprobs, mask, correction, correction_cap)
        per_token = per_token * weights
    if mb.ref_logprobs is not None and kl_coef > 0:
        kl_tok = KL_ESTIMATORS.get(kl_estimator)(logp, mb.ref_logprobs, old, mask)
        kl_w = mb.kl_weights.unsqueeze(-1) if mb.kl_weights is not None else 1.0
        if correct_kl and weights is not None:
            kl_tok = kl_tok * weights
        per_token = per_token + kl_coef * kl_w * kl_tok
    if mb.token_weights is not None:
        per_token = per_token * mb.token_weights
    if mb.sample_weights is not None:
        per_token = per_token * mb.sample_weights.unsqueeze(-1)
    return per_token, stats
