"""PPO's clipped surrogate with DAPO's clip-higher and the dual clip (signature in `base`)."""
from __future__ import annotations

import torch

from .base import POLICY_LOSSES, Stats, per_token


@POLICY_LOSSES.register("ppo_clip", token_clip=True)
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """Token-level PPO clip with separate ranges and optional dual clip.

    ``loss_t = max(-A r_t, -A clip(r_t, 1 - clip_low, 1 + clip_high))``, ``r_t = π/π_old``
    (Schulman et al., arXiv 1707.06347). ``clip_high > clip_low`` is DAPO's clip-higher
    (Yu et al., arXiv 2503.14476). With ``dual_clip = c > 1`` the loss of a negative-advantage
    token is also capped at ``-c A`` so a huge ratio cannot blow it up (Ye et al., arXiv
    1912.09729).

    Stats: ``clip_ratio/low`` (r < 1-clip_low with A < 0: gradient clipped away),
    ``clip_ratio/high`` (r > 1+clip_high with A > 0), ``clip_ratio/region`` (either),
    ``clip_ratio/dual`` (capped by the dual clip).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip}); use None to disable it, or 10 as in DAPO")
    adv = per_token(advantages, logprobs)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    low = ((ratio < 1.0 - clip_low) & (adv < 0)).float()
    high = ((ratio > 1.0 + clip_high) & (adv > 0)).float()
    stats = {"clip_ratio/low": low, "clip_ratio/high": high, "clip_ratio/region": low + high}
    if dual_clip is not None:
        cap = -adv * dual_clip
        capped = (adv < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        stats["clip_ratio/dual"] = capped.float()
    return loss, stats
