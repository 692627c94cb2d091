"""Policy losses whose importance weight looks beyond the current token: GSPO, CTPO, MinPRO.

Each has the signature of `losses.base`. The trick shared by all three: a per-token factor with
the *value* of a sequence- or prefix-level ratio and the *gradient* of the token's own
log-prob is ``exp(sg(v) + logπ_t - sg(logπ_t))`` (value ``e^v``, gradient ``e^v ∇logπ_t``).
Per-token log-ratios ``log π/π_old`` are detached and clamped to ±20 before they are summed, so
a stale token cannot overflow ``exp``.
"""
from __future__ import annotations

import torch

from ..numerics import clamp_log_ratio
from .base import POLICY_LOSSES, Stats, per_token
from .ppo import ppo_clip_loss

def detached_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sg(log π - log π_old)`` per token, clamped to ±20, 0 on padding."""
    d = clamp_log_ratio(logprobs.detach() - old_logprobs.detach())
    return d * mask


@POLICY_LOSSES.register("gspo")
def gspo_loss(
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
    """GSPO-token: PPO clip on the length-normalised sequence ratio.

    Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071.
    ``s_i = exp((1/|y_i|) Σ_t log(π/π_old))`` and per token ``s_{i,t} = sg(s_i)·π_t/sg(π_t)``;
    ``loss_t = max(-A s_{i,t}, -A clip(s_{i,t}, 1 - clip_low, 1 + clip_high))``. With one
    advantage per sequence and ``seq-mean-token-mean`` this is exactly GSPO's sequence
    objective (gradient ``-A s_i (1/|y|) Σ_t ∇logπ_t``) and the clip decision is shared by the
    whole sequence. Use the ``gspo`` preset: the paper's ranges (3e-4, 4e-4) are far narrower
    than PPO's token ranges, so the ``grpo`` preset's 0.2 would leave GSPO unclipped.

    Stats: ``clip_ratio/{low,high,region}`` (as `ppo_clip_loss`, decided per sequence) and
    ``gspo/seq_ratio`` (``s_i``): with one advantage per sequence each is ``[N]``, one value per
    sequence, so its metric is the mean over sequences (TRL's, at ``importance_sampling_level=
    "sequence"``); with token advantages ``[N, C]``, a token mean.
    """
    mask = mask.to(logprobs.dtype)
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)
    seq_log = detached_log_ratio(logprobs, old_logprobs, mask).sum(-1, keepdim=True) / lengths
    # ppo_clip_loss sees log-ratio seq_log + logπ - sg(logπ): ratio value s_i, gradient s_i ∇logπ_t.
    token_log = seq_log + logprobs - logprobs.detach()
    loss, stats = ppo_clip_loss(token_log, torch.zeros_like(token_log), advantages, mask,
                                clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    if advantages.dim() == 1:  # the clip decision is the row's: one value per sequence, logged as their mean (TRL's)
        stats = {k: v[:, 0] for k, v in stats.items()}
        stats["gspo/seq_ratio"] = seq_log.exp()[:, 0]
    else:
        stats["gspo/seq_ratio"] = seq_log.exp().expand_as(logprobs)
    return loss, stats


@POLICY_LOSSES.register("ctpo")
def ctpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.025,
    clip_high: float = 0.05,
    power: float = 0.5,
    dual_clip_coef: float | None = None,
    max_log_ratio: float = 10.0,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """CTPO: cumulative token ratio with position-adaptive log-space clipping.

    Zhang et al., "Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token
    Perspective", arXiv 2605.07331 (code: horizon-llm/CTPO). Per token, with t the token's
    position among its row's *model* tokens (1 for the first token with mask 1; tool or
    environment tokens, mask 0, are not steps of the walk and add nothing to the sum)::

        log r_t = sg(min(Σ_{s≤t} log(π/π_old)_s, max_log_ratio)) + logπ_t - sg(logπ_t)
        loss_t  = max(-A r_t, -A exp(clip(log r_t, -clip_low·t^p, clip_high·t^p)))

    and for ``A < 0`` the loss is also capped at ``-A exp(dual_clip_coef·t^p)`` (dual clip).
    The bounds widen as ``√t`` because the cumulative log-ratio is a random walk. Here
    ``clip_low``/``clip_high`` are the *coefficients* of ``t^p`` (the ``ctpo`` preset sets the
    paper's 0.025 and 0.05); ``dual_clip_coef`` defaults to ``clip_high`` (0.05, as in the
    authors' code); the module's constant ``dual_clip`` is not used.

    Stats: ``clip_ratio/{low,high,region,dual}``.
    """
    mask = mask.to(logprobs.dtype)
    adv = per_token(advantages, logprobs)
    cum = detached_log_ratio(logprobs, old_logprobs, mask).cumsum(-1).clamp(max=max_log_ratio)
    log_r = cum + logprobs - logprobs.detach()
    # t counts model tokens only: a tool's or environment's tokens (mask 0) add no step to the walk.
    t = mask.cumsum(-1).clamp(min=1).pow(power)
    lo, hi = -clip_low * t, clip_high * t
    loss = torch.maximum(-adv * log_r.exp(), -adv * torch.clamp(log_r, lo, hi).exp())
    cap = -adv * torch.exp((clip_high if dual_clip_coef is None else dual_clip_coef) * t)
    dual = (adv < 0) & (loss > cap)
    loss = torch.where(dual, cap, loss)
    low = ((cum < lo) & (adv < 0)).to(logprobs.dtype)
    high = ((cum > hi) & (adv > 0)).to(logprobs.dtype)
    return loss, {"clip_ratio/low": low, "clip_ratio/high": high, "clip_ratio/region": low + high,
                  "clip_ratio/dual": dual.to(logprobs.dtype)}


@POLICY_LOSSES.register("minpro", token_clip=True)
def minpro_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    include_current: bool = False,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """MinPRO: the prefix ratio replaced by the minimum token ratio of the prefix.

    Lei, Cheng & Tao, "A Step Back: Prefix Importance Ratio Stabilizes Policy Optimization",
    arXiv 2601.22718. The exact off-policy correction of token t is the prefix product
    ``Π_{i<t} ρ_i`` times the token's own ``ρ_t``; MinPRO swaps the unstable product for the
    detached ``w_t = sg(min_{i<t} ρ_i)`` and keeps the token-level PPO clip on ``ρ_t``:
    ``loss_t = w_t · ppo_clip_t``. The prefix holds the row's earlier *model* tokens only
    (mask 1): tool or environment tokens are never in it, and a token with no model token
    before it (the first one, even after masked tokens) has the empty prefix, ``w_t = 1``.

    Open choice (the paper's text available to us does not settle it): whether the minimum
    includes token t itself. Default ``include_current=False`` (the *preceding* prefix, which
    is what the product it replaces covers); ``True`` uses ``min_{i≤t} ρ_i``.

    Stats: those of `ppo_clip_loss` and ``minpro/prefix_weight`` (``w_t``).
    """
    real = mask > 0
    d = clamp_log_ratio(logprobs.detach() - old_logprobs.detach())
    prefix = d.masked_fill(~real, float("inf")).cummin(-1).values  # masked tokens are never the minimum
    if not include_current:
        prefix = torch.cat([torch.full_like(prefix[:, :1], float("inf")), prefix[:, :-1]], dim=-1)
    # +inf is the minimum of an empty prefix (no model token before): its weight is 1, not e^20.
    prefix = torch.where(torch.isinf(prefix), torch.zeros_like(prefix), prefix)
    weight = torch.where(real, prefix.exp(), torch.ones_like(prefix))
    loss, stats = ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_low=clip_low,
                                clip_high=clip_high, dual_clip=dual_clip)
    stats["minpro/prefix_weight"] = weight
    return loss * weight, stats
