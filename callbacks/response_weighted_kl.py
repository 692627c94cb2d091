"""REVA-PO RER: a per-response KL weight from the advantage sign and the reference entropy."""
from __future__ import annotations

from typing import Any

import torch

from lightning_rlpt.hooks import RLCallback

from ._common import log_metrics, require, require_reference, row_token_mean, trained_rows


class ResponseWeightedKL(RLCallback):
    """Response-weighted regularisation (RER) of REVA-PO (LiGuo12/REVA_PO; docs/callbacks.md).

    For response i with advantage ``A_i``, ``H_i`` the token-mean entropy of the *reference*
    on it and ``x_i = (H_i − min_g H)/(max_g H − min_g H + eps)`` (min-max within its group):

    - ``A_i > 0``: ``β_i = b_min + (b_base − b_min)(1 − x_i)`` — a good response the reference
      was confident about is held less tightly;
    - ``A_i < 0``: ``β_i = b_base + (b_max − b_base)·x_i`` — a bad, uncertain one more tightly;
    - ``A_i = 0``: ``β_i = b_base``; then ``β_i ← max(β_i, 0)``.

    The module multiplies its KL term per response by ``kl_coef · kl_weights``; this callback
    writes ``kl_weights = β_i / b_base`` (in ``on_advantages_computed``), so the module's
    ``kl_coef`` plays ``b_base``. To reproduce the paper exactly use ``RLModule(kl_coef=0.1,
    kl_estimator="k3")`` (REVA-PO's KL is the token mean of ``β_i·k3``). In setup it sets
    ``module.request(ref_entropy=True)`` (the reference forward then also returns entropies).
    Token-level advantages ``[N, C]`` are reduced to their token mean for the sign. Token means
    run over the tokens the loss trains on (``module.loss_mask``); a row without any (a truncated
    row under ``mask_truncated_completions``) is left out of its group's min-max and gets weight 1.

    Args:
        b_min / b_base / b_max: 0.05, 0.10, 0.12 (REVA-PO); ``0 <= b_min <= b_base <= b_max``
            and ``b_base > 0``.
        eps: the min-max denominator's guard (1e-6).

    Logs ``rer/weight_mean``, ``rer/weight_min``, ``rer/weight_max``, ``rer/ref_entropy``.

    Examples:
        >>> import torch
        >>> from lightning_rlpt.callbacks import ResponseWeightedKL
        >>> rer = ResponseWeightedKL()
        >>> beta = rer.betas(torch.tensor([1.0, -1.0, 0.0, 1.0]), torch.tensor([0.0, 2.0, 1.0, 2.0]), 4)
        >>> [round(b, 4) for b in beta.tolist()]
        [0.1, 0.12, 0.1, 0.05]
    """

    requires = ("use_reference", "request", "loss_mask")

    def __init__(self, b_min: float = 0.05, b_base: float = 0.10, b_max: float = 0.12, eps: float = 1e-6):
        require(0 <= b_min <= b_base <= b_max, f"need 0 <= b_min <= b_base <= b_max (got {b_min}, {b_base}, {b_max}: inverted?)")
        require(b_base > 0, f"b_base must be > 0: the weights are beta_i / b_base (got {b_base})")
        require(eps > 0, f"eps must be > 0 (got {eps})")
        self.b_min, self.b_base, self.b_max, self.eps = b_min, b_base, b_max, eps

    def betas(self, advantages: torch.Tensor, ref_entropy: torch.Tensor, group_size: int,
              trained: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` per-response β from ``[N]`` advantages and ``[N]`` token-mean reference entropies.

        Args:
            advantages / ref_entropy: ``[N]`` each.
            group_size: G (rows of one group are contiguous).
            trained: ``[N]`` bool, the rows the loss trains on (default all); the others are
                out of the min-max and keep ``b_base``.
        """
        trained = torch.ones_like(advantages, dtype=torch.bool) if trained is None else trained.bool()
        h = ref_entropy.float().view(-1, group_size)
        inside = trained.view(-1, group_size)
        lo = h.masked_fill(~inside, float("inf")).min(1, keepdim=True).values
        hi = h.masked_fill(~inside, float("-inf")).max(1, keepdim=True).values
        x = ((h - lo) / (hi - lo + self.eps)).reshape(-1)
        beta = torch.full_like(x, self.b_base)
        pos, neg = (advantages > 0) & trained, (advantages < 0) & trained
        beta[pos] = self.b_min + (self.b_base - self.b_min) * (1 - x[pos])
        beta[neg] = self.b_base + (self.b_max - self.b_base) * x[neg]
        return beta.clamp(min=0)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        require_reference(pl_module, "ResponseWeightedKL")
        pl_module.request(ref_entropy=True)

    def on_advantages_computed(self, trainer, module, experience):
        entropy = experience.info.get("ref_entropy")
        if entropy is None:
            raise RuntimeError("ResponseWeightedKL needs experience.info['ref_entropy']; it asks "
                               "module.request(ref_entropy=True) in setup: was setup skipped?")
        mask = module.loss_mask(experience)
        rows = trained_rows(mask)
        adv = experience.advantages
        adv = row_token_mean(adv, mask) if adv.dim() == 2 else adv
        h = row_token_mean(entropy.float(), mask)
        weights = self.betas(adv, h, experience.group_size, rows) / self.b_base
        experience.kl_weights = weights if experience.kl_weights is None else experience.kl_weights * weights
        kept = weights[rows] if rows.any() else weights  # the logged figures describe the trained rows
        log_metrics(module, "rer", {"weight_mean": kept.mean().item(), "weight_min": kept.min().item(),
                                    "weight_max": kept.max().item(), "ref_entropy": h[rows].mean().item()})
