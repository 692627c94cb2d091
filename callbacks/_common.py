"""Small helpers the seed-method callbacks share (not part of the public API)."""
from __future__ import annotations

from typing import Any

import torch

from lightning_rlpt.model.distributed import reduce_over_ranks


def log_metrics(module: Any, prefix: str, values: dict[str, float]) -> None:
    """``module.log`` each value as ``prefix/name`` for this step (values are already global)."""
    for name, value in values.items():
        module.log(f"{prefix}/{name}", float(value), on_step=True, on_epoch=False, batch_size=1)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def require_reference(module: Any, who: str) -> None:
    """KL callbacks drive the KL-to-reference term, which exists only with a reference."""
    if not getattr(module, "use_reference", False):
        raise ValueError(f"{who} drives the KL-to-reference term, but this RLModule has no reference model "
                         "(use_reference is False): pass reference=True (or kl_coef > 0) to RLModule")


def row_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean of ``values`` over the tokens of ``mask``: ``[N, C] -> [N]`` (0 for a row
    without any). Pass ``module.loss_mask(experience)``: the tokens the loss trains on.

    Args:
        values: ``[N, C]`` per-token values.
        mask: ``[N, C]`` 1 on the tokens to average.
    """
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def global_token_mean(trainer: Any, mask: torch.Tensor, *values: torch.Tensor) -> list[float]:
    """Each of ``values`` averaged over the tokens of ``mask`` on every data-parallel rank
    (``Σ_ranks Σ v·m / Σ_ranks Σ m``, 0 when no rank has a token), in one all-reduce. Pass
    ``module.loss_mask(experience)``, so a statistic covers the tokens the loss trains on.

    Args:
        trainer: the Trainer (its strategy reduces; None: this process only).
        mask: ``[N, C]`` 1 on the tokens to average.
        values: ``[N, C]`` per-token values, one mean each.

    Examples:
        >>> mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
        >>> global_token_mean(None, mask, torch.tensor([[1.0, 3.0], [9.0, 9.0]]))
        [2.0]
    """
    mask = mask.double()
    sums = [float((v.detach().double() * mask).sum()) for v in values]
    *totals, count = reduce_over_ranks(trainer, [*sums, float(mask.sum())])
    return [t / count if count > 0 else 0.0 for t in totals]


def trained_rows(mask: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: the rows with at least one token of ``mask`` (a masked truncated row has none)."""
    return mask.sum(-1) > 0
