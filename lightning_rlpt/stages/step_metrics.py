"""The extreme per-sequence clip fractions TRL logs beside the token means, and how a
mini-batch's micro-batch metrics add up (docs/metrics.md).

``clip_ratio/low_min`` is the smallest, over the mini-batch's sequences on every rank, of the
fraction of a sequence's trained tokens that the policy loss clipped low; ``clip_ratio/high_max``
the largest high-clipped fraction (TRL's ``GRPOTrainer._compute_loss``: ``nanmin`` / ``nanmax``
of the gathered ``masked_seq_mean`` of ``is_low_clipped`` / ``is_high_clipped``). Sequences
without a trained token have no fraction and are skipped, as TRL's NaNs are. Every other metric
of `PolicyUpdate.loss_and_logprobs` is a micro-batch's share of a sum, so shares add up; these two
take the min / max instead.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..model.distributed import reduce_over_ranks

# metric -> (the policy loss's per-token stat it summarises, the reduction over sequences)
EXTREMES = {"clip_ratio/low_min": ("clip_ratio/low", min), "clip_ratio/high_max": ("clip_ratio/high", max)}


def clip_extremes(stats: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """This (micro-)batch's extremes of the per-sequence clip fractions, for the losses whose
    stats have ``clip_ratio/low`` / ``clip_ratio/high``; ±inf (neutral for min / max) when no row
    has a trained token.

    Args:
        stats: the policy loss's per-token stats (``[N, C]`` each).
        mask: ``[N, C]`` the trained tokens.
    """
    tokens = mask.sum(-1)
    rows = tokens > 0
    out = {}
    for name, (stat, pick) in EXTREMES.items():
        if stat in stats and stats[stat].dim() == 1:  # one decision per sequence (GSPO): every row's, as TRL's
            fractions = stats[stat].detach().float().tolist()
        elif stat in stats:
            fractions = ((stats[stat].detach().float() * mask).sum(-1)[rows] / tokens[rows]).tolist()
        else:
            continue
        out[name] = pick(fractions) if fractions else (math.inf if pick is min else -math.inf)
    return out


def add_metrics(totals: dict[str, float], metrics: dict[str, float]) -> None:
    """Fold one micro-batch's ``metrics`` into ``totals``: shares add, extremes take min / max."""
    for key, value in metrics.items():
        if key in EXTREMES:
            totals[key] = EXTREMES[key][1](totals.get(key, value), value)
        else:
            totals[key] = totals.get(key, 0.0) + value


def reduce_extremes(trainer: Any, totals: dict[str, float]) -> None:
    """Replace each rank's extremes in ``totals`` by those over all ranks (one all-reduce; every
    rank runs the same policy loss, so every rank has the same keys); 0.0 when no rank had a
    trained sequence (nothing was clipped)."""
    names = [name for name in EXTREMES if name in totals]
    if not names:
        return
    # One min-reduce for both: a max is minus the min of the negated values.
    signed = [totals[n] if EXTREMES[n][1] is min else -totals[n] for n in names]
    for name, value in zip(names, reduce_over_ranks(trainer, signed, op="min")):
        value = value if EXTREMES[name][1] is min else -value
        totals[name] = value if math.isfinite(value) else 0.0
