"""Validation metrics: accuracy and unbiased pass@k as torchmetrics (synced across ranks)."""
from __future__ import annotations

import warnings
from math import comb

import torch
from torchmetrics import Metric


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (arXiv 2107.03374): ``1 - C(n-c, k) / C(n, k)`` for c correct of n samples."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt (got {n}); raise val_samples")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


def pass_at_k_metrics(val_pass_k: list[int] | None, val_samples: int, temperature: float) -> dict[str, "PassAtK"]:
    """The pass@k metrics validation logs (default k: 1 and ``val_samples``), checked against what
    validation samples: no k above ``val_samples``, and a warning when greedy decoding makes the
    ``val_samples`` completions one completion repeated (pass@n would read pass@1)."""
    ks = sorted(set(val_pass_k or ([1, val_samples] if val_samples > 1 else [1])))
    if max(ks) > val_samples:
        raise ValueError(f"val_pass_k={ks} asks for more samples than val_samples={val_samples}")
    if max(ks) > 1 and temperature == 0:
        warnings.warn(f"val_samples={val_samples} with greedy validation (temperature 0): the {val_samples} "
                      f"completions of a prompt are one completion repeated, so pass@{max(ks)} equals pass@1. "
                      "Sample them: val_generation=dict(temperature=0.8) (Codex's setting for pass@k, k > 1)",
                      stacklevel=3)
    return {str(k): PassAtK(k) for k in ks}


class PassAtK(Metric):
    """Mean over prompts of pass@k, from a ``[prompts, n]`` boolean matrix of correct samples.

    Examples:
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
