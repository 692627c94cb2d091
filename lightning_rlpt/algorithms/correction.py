"""Train/inference mismatch correction: importance weights from the learner's rollout-time
log-probs over the engine's behaviour log-probs.

The rollout engine (vLLM, say) samples from ``π_behav``; the learner's recomputed
``π_old`` differs by kernels, precision and stale weights. The weight
``w = π_old / π_behav`` corrects the policy gradient (Yao et al., "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training", 2025; verl's ``rollout_corr``):

- ``token_tis``: per-token ``min(w_t, cap)`` (truncated IS);
- ``seq_tis``: per-sequence ``min(Π_t w_t, cap)`` on every token of the sequence;
- ``token_mis``: per-token ``w_t``, tokens with ``w_t > cap`` masked out (masked IS);
- ``seq_mis``: per-sequence ``Π_t w_t``, sequences above ``cap`` masked out.

The weights are detached and multiply the per-token *policy-gradient* loss only; the KL term
is added unweighted, as in TRL and verl (`surrogate` says why, and when
``RLModule(rollout_correction_kl=True)`` weights it too).
"""
from __future__ import annotations

import torch

from .numerics import clamp_log_ratio, safe_ratio

MODES = ("token_tis", "seq_tis", "token_mis", "seq_mis")


def check_mode(mode: str | None, cap: float) -> None:
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown rollout_correction {mode!r}; known: {', '.join(MODES)} (or None)")
    if cap <= 1.0:
        raise ValueError(f"rollout_correction_cap must be > 1 (got {cap}); 2 to 8 is usual")


def log_ratio(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log(π_old/π_behav)`` per token, clamped, 0 on padding and where the engine gave no
    log-prob (NaN): such a token's weight is 1, no correction, as TRL's ``nan_to_num`` makes it."""
    return torch.nan_to_num(clamp_log_ratio(old_logprobs - behaviour_logprobs) * mask, nan=0.0)


def sequence_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N]`` detached sequence IS weights ``exp(Σ_t mask·(old − behaviour))`` in float64, the
    log clamped to ±MAX_LOG_RATIO (`safe_ratio`); 1 for a row without masked tokens."""
    return safe_ratio(torch.nan_to_num((old_logprobs.detach().double() - behaviour_logprobs.double()) * mask.double(),
                                       nan=0.0).sum(-1))


def correction_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                       mode: str, cap: float) -> torch.Tensor:
    """``[N, C]`` detached weights for the per-token loss (see the module docstring)."""
    d = log_ratio(old_logprobs.detach(), behaviour_logprobs, mask)
    if mode.startswith("seq"):
        w = torch.exp(d.sum(-1, keepdim=True)).expand_as(d)
    else:
        w = torch.exp(d)
    if mode.endswith("tis"):
        return w.clamp(max=cap) * mask
    return w * (w <= cap).to(w.dtype) * mask


def mismatch_metrics(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """TRL's ``sampling/importance_sampling_ratio/*`` (token level) and ``sampling/logp_diff/*``."""
    m = mask.bool()
    raw = old_logprobs.detach() - behaviour_logprobs
    d = raw[m & ~raw.isnan()]  # a token the engine could not score is left out of the differences (TRL too)
    if raw[m].numel() == 0:
        return {}
    ratio = safe_ratio(torch.nan_to_num(raw, nan=0.0)[m])  # ... and weighs 1
    return {"sampling/importance_sampling_ratio/min": ratio.min().item(),
            "sampling/importance_sampling_ratio/mean": ratio.mean().item(),
            "sampling/importance_sampling_ratio/max": ratio.max().item(),
            "sampling/logp_diff/mean": d.abs().mean().item() if d.numel() else 0.0,
            "sampling/logp_diff/max": d.abs().max().item() if d.numel() else 0.0}
