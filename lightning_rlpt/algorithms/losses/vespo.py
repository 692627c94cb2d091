"""VESPO: a REINFORCE loss weighted by a smooth Gamma-shaped kernel of the sequence IS weight."""
from __future__ import annotations

import math

import torch

from ..numerics import clamp_log_ratio
from .base import POLICY_LOSSES, Stats, per_token

# log w is clamped to [log 1e-8, 20]: as in the authors' code, which clamps w at 1e-8 below.
MIN_LOG_WEIGHT = math.log(1e-8)
MAX_LOG_WEIGHT = 20.0
# φ below this: the row's gradient is effectively gone (the ``vespo/phi_vanished`` stat).
VANISHED = 1e-3


# How a token's π_old/π_behav above ``behaviour_cap`` counts (TRL's ``vllm_importance_sampling_mode``):
# "truncate" (token_truncate) at the cap; "mask" (token_mask) as the weight's floor 1e-8, as TRL's
# masked ratio 0 is clamped in log space; None ignores the engine's log-probs (TRL without correction).
BEHAVIOUR_MODES = ("truncate", "mask", None)


def sequence_log_weight(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
                        behaviour_logprobs: torch.Tensor | None, behaviour_cap: float | None = None,
                        behaviour_mode: str | None = "truncate") -> torch.Tensor:
    """``[N, 1]`` detached ``log w_i = Σ_t log(π/π_old) (+ Σ_t log(π_old/π_behav))``, each token's
    term clamped (``π_old/π_behav`` above ``behaviour_cap`` truncated or masked, `BEHAVIOUR_MODES`;
    a token without a behaviour log-prob, NaN, counts 1), then the sum clamped to ``[log 1e-8, 20]``;
    padding adds nothing."""
    mask = mask.to(logprobs.dtype)
    log_w = (clamp_log_ratio(logprobs.detach() - old_logprobs.detach()) * mask).sum(-1, keepdim=True)
    if behaviour_logprobs is not None and behaviour_mode is not None:
        mismatch = torch.nan_to_num((old_logprobs.detach() - behaviour_logprobs.to(logprobs.dtype)) * mask, nan=0.0)
        top = MAX_LOG_WEIGHT if behaviour_cap is None else min(math.log(behaviour_cap), MAX_LOG_WEIGHT)
        if behaviour_mode == "mask":
            mismatch = torch.where(mismatch > top, torch.full_like(mismatch, MIN_LOG_WEIGHT), mismatch)
        log_w = log_w + (mismatch.clamp(MIN_LOG_WEIGHT, top) * mask).sum(-1, keepdim=True)
    return log_w.clamp(MIN_LOG_WEIGHT, MAX_LOG_WEIGHT)


@POLICY_LOSSES.register("vespo", self_correcting=True)
def vespo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    behaviour_cap: float | None = 3.0,
    behaviour_mode: str | None = "truncate",
    behaviour_logprobs: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, Stats]:
    """``loss_t = -sg(φ(w_i))·A·logπ_t``, ``φ(w) = e^λ·w^k·e^{-λw}``, w the sequence IS weight.

    Shen et al., "VESPO: Variational Sequence-Level Soft Policy Optimization for Stable
    Off-Policy LLM Training", arXiv 2602.10693. ``w_i = Π_t π/π_behav`` over the row's trained
    tokens, not length-normalised: ``π/π_old`` times, when the engine reports behaviour
    log-probs, ``π_old/π_behav`` (the train/inference mismatch; without them π_old is taken as
    the sampler). φ is a Gamma-shaped kernel with ``φ(1) = 1``, peaked at ``w = k/λ``, that
    fades smoothly toward 0 for ``w → 0`` and ``w → ∞``: it replaces both the clip and the
    rollout correction, hence the ``self_correcting`` trait (``rollout_correction="auto"``
    leaves the module's own correction off). ``k, λ = k_pos, lambda_pos`` where ``A ≥ 0``, else
    ``k_neg, lambda_neg`` (the authors' and TRL's defaults 2, 3, 3, 2). Computed in log space:
    ``log φ = λ + k log w - λ w``. Aggregate with ``token-mean`` (the ``vespo`` preset, TRL's).
    Each token's ``π_old/π_behav`` is truncated at ``behaviour_cap`` before the product, as TRL
    feeds its kernel the token-truncated ratio (``GRPOTrainer.get_gamma_weights`` with
    ``vllm_importance_sampling_mode="token_truncate"``, ``vllm_importance_sampling_clip_max=3``):
    untruncated, a few tokens the sampler found far less likely push a long row's ``w`` to
    ``e^20``, where ``φ`` is 0 and the row silently drops out.

    Args:
        k_pos / lambda_pos: the kernel's power and decay for non-negative advantages.
        k_neg / lambda_neg: the same for negative advantages.
        behaviour_cap: > 0, the most a token's ``π_old/π_behav`` counts for (TRL's default 3);
            None: no truncation (only the ``[1e-8, e^20]`` clamp).
        behaviour_mode: ``"truncate"`` (TRL's ``token_truncate``), ``"mask"`` (``token_mask``: a
            token above the cap counts as the weight's floor 1e-8, which all but drops its row) or
            None (the engine's log-probs are not used: TRL with its correction off).
        behaviour_logprobs: the engine's, passed by the module.

    Stats: ``vespo/phi_seq`` (``φ(w_i)``, one per sequence with sequence advantages: logged as
    the mean over sequences, as TRL's ``vespo/phi_seq_mean``); ``vespo/phi_vanished`` (1 on the tokens
    of rows with ``φ < 1e-3``, which the kernel has all but dropped: logged as the fraction of
    trained tokens).
    """
    if min(k_pos, k_neg) < 0 or min(lambda_pos, lambda_neg) <= 0:
        raise ValueError(f"vespo needs k >= 0 and lambda > 0 (got k_pos={k_pos}, lambda_pos={lambda_pos}, "
                         f"k_neg={k_neg}, lambda_neg={lambda_neg}); the authors use 2, 3, 3, 2")
    if behaviour_mode not in BEHAVIOUR_MODES:
        raise ValueError(f"vespo's behaviour_mode must be one of {BEHAVIOUR_MODES} (got {behaviour_mode!r})")
    if behaviour_cap is not None and not behaviour_cap > 0:
        raise ValueError(f"vespo's behaviour_cap must be > 0 or None (got {behaviour_cap!r}); TRL's default is 3.0")
    adv = per_token(advantages, logprobs)
    log_w = sequence_log_weight(logprobs, old_logprobs, mask, behaviour_logprobs, behaviour_cap, behaviour_mode)
    nonneg = adv >= 0
    k = torch.where(nonneg, logprobs.new_tensor(k_pos), logprobs.new_tensor(k_neg))
    lam = torch.where(nonneg, logprobs.new_tensor(lambda_pos), logprobs.new_tensor(lambda_neg))
    phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    # Rows the kernel has all but dropped (w far from 1): counted, since they leave no other trace.
    vanished = (phi < VANISHED).to(logprobs.dtype).expand_as(logprobs)
    per_sequence = phi[:, 0] if advantages.dim() == 1 else phi  # one φ per row: a mean over rows, as TRL's
    return -phi * adv * logprobs, {"vespo/phi_seq": per_sequence, "vespo/phi_vanished": vanished}
