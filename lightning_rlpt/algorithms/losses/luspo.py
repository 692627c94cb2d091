"""LUSPO: GSPO with each sequence's loss scaled by its length."""
from __future__ import annotations

import torch

from .base import POLICY_LOSSES, Stats
from .sequence import gspo_loss


@POLICY_LOSSES.register("luspo", aggregation="seq-mean-token-mean")
def luspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """``loss_t = |y_i| · gspo_t``: GSPO's per-token loss times the sequence's length.

    Liu et al., "Length-Unbiased Sequence Policy Optimization: Revealing and Controlling
    Response Length Variation in RLVR", arXiv 2602.05261. GSPO weighs every sequence alike, so
    a long response gives each of its tokens ``1/|y|`` of the gradient a short one gives, which
    pushes responses shorter; LUSPO multiplies each sequence's loss by ``|y_i|`` (the count of
    its trained tokens). Made for ``seq-mean-token-mean``: then the objective is
    ``(1/N) Σ_i |y_i| ℓ_i`` with ``ℓ_i`` GSPO's clipped sequence loss, and the gradient
    ``-(A_i s_i/N) Σ_t ∇logπ_t`` (the ``luspo`` preset, as TRL's ``loss_type="luspo"``).
    With ``token-mean`` or ``seq-mean-token-sum`` the length would count twice, so another
    aggregation is refused at construction (the ``aggregation`` trait).

    Args:
        clip_low / clip_high: the sequence-ratio range, GSPO's (the ``luspo`` preset: 3e-4 / 4e-4).
        dual_clip: as in `ppo_clip_loss`.

    Stats: those of `gspo_loss` (``clip_ratio/*``, ``gspo/seq_ratio``).
    """
    loss, stats = gspo_loss(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                            dual_clip=dual_clip)
    lengths = mask.to(logprobs.dtype).sum(-1, keepdim=True)
    return loss * lengths, stats
