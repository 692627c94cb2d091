"""Loss aggregation: how per-token losses become one scalar (verl's ``loss_agg_mode``).

The denominators are *global*: ``num_tokens`` and ``num_seqs`` count the whole optimizer-step
batch over all data-parallel ranks, so the loss (and its gradient) does not change with the
parallel layout or with how a rollout is cut into mini-batches. The module supplies them; with
the defaults (None) the local counts are used. Each mode returns this rank's share: the shares
of all ranks add up to the loss.

The one exception is ``bnpo`` (TRL's ``loss_type="bnpo"``): each rank divides by its *own*
token count (``local_tokens``, the rank's part of the mini-batch, never a micro-batch's) and
the loss is the mean of the ranks' token means, so it changes with the number of ranks, as
TRL's does. TRL's "local batch" is one device's micro-batch; here micro-batches are a memory
knob that must not change the gradient, so the rank's mini-batch is the unit: the same as TRL
with ``gradient_accumulation_steps=1``.
"""
from __future__ import annotations

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "bnpo")


def check_aggregation(mode: str) -> None:
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; known: {', '.join(AGGREGATIONS)}")


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
    local_tokens: float | None = None,
    num_ranks: int = 1,
) -> torch.Tensor:
    """Reduce ``[N, C]`` per-token ``loss`` over the 1s of ``mask``.

    Args:
        mode: ``token-mean`` Σ loss / Σ tokens (DAPO); ``seq-mean-token-sum`` mean over
            sequences of each sequence's token sum; ``seq-mean-token-mean`` mean over sequences
            of each sequence's token mean (original GRPO); ``seq-mean-token-sum-norm``
            Σ loss / (sequences · ``norm_length``) with a constant length, Dr. GRPO's unbiased
            form (``norm_length`` defaults to the padded width C; the module passes the
            generation budget ``max_new_tokens``); ``bnpo`` Σ loss / (``local_tokens`` ·
            ``num_ranks``): this rank's token mean, a share of the mean over ranks.
        num_tokens: global count of unmasked tokens (default: this batch's).
        num_seqs: global count of sequences (default: this batch's rows).
        norm_length: the constant of ``seq-mean-token-sum-norm``.
        local_tokens: ``bnpo``: this rank's count of unmasked tokens in the mini-batch (default:
            this batch's).
        num_ranks: ``bnpo``: the data-parallel ranks whose token means are averaged.

    Examples:
        >>> loss = torch.tensor([[1., 3.], [2., 0.]]); mask = torch.tensor([[1., 1.], [1., 0.]])
        >>> aggregate_loss(loss, mask, "token-mean").item()
        2.0
        >>> aggregate_loss(loss, mask, "seq-mean-token-mean").item()
        2.0
        >>> aggregate_loss(loss, mask, "seq-mean-token-sum").item()
        3.0
    """
    check_aggregation(mode)
    mask = mask.to(loss.dtype)
    masked = loss * mask
    seqs = float(num_seqs) if num_seqs is not None else float(loss.shape[0])
    if mode == "token-mean":
        tokens = float(num_tokens) if num_tokens is not None else mask.sum().clamp(min=1)
        return masked.sum() / tokens
    if mode == "bnpo":
        local = float(local_tokens) if local_tokens is not None else mask.sum().item()
        return masked.sum() / (max(local, 1.0) * num_ranks)  # a rank with no token adds 0, as in TRL
    if mode == "seq-mean-token-sum":
        return masked.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum() / seqs
    length = float(norm_length) if norm_length is not None else float(loss.shape[1])
    return masked.sum() / (seqs * length)
