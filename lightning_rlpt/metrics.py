"""Validation metrics: accuracy and unbiased pass@k as torchmetrics (synced across ranks)."""
from __future__ import annotations

from math import comb

import torch
from torchmetrics import Metric


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (arXiv 2107.03374): ``1 - C(n-c, k) / C(n, k)`` for c correct of n samples."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt (got {n}); raise val_samples")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


class PassAtK(Metric):
    """Mean over prompts of pass@k, from a ``[prompts, n]`` boolean matrix of correct samples.

    Example:
        >>> m = PassAtK(k=1); m.update(torch.tensor([[True, False], [False, False]])); m.compute().item()
        0.25
    """

    full_state_update = False

    def __init__(self, k: int = 1):
        super().__init__()
        self.k = k
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: torch.Tensor) -> None:
        n = correct.shape[1]
        scores = sum(pass_at_k(n, int(c), self.k) for c in correct.sum(dim=1).tolist())
        # Out of place: states reset under `trainer.validate`'s inference mode stay inference tensors.
        self.total = self.total + scores
        self.count = self.count + correct.shape[0]

    def compute(self) -> torch.Tensor:
        return (self.total / self.count.clamp(min=1)).float()
