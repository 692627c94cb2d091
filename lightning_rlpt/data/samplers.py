"""Prompt samplers: `EpochSampler` (seeded epochs cut into global batches) and its weighted,
resumable version for curricula, `WeightedEpochSampler`.

Each weighted epoch's order is a weighted draw of ``epoch_size`` prompt indices, seeded by
``seed + epoch``, from a snapshot of the weights taken when the epoch starts (``set_epoch``).
By default the draws are *with replacement*, so a prompt's share of the training is its share
of the weight: a draw without replacement of all n prompts would be a permutation, and the
weights would only change the order. ``replacement=False`` keeps distinct prompts per epoch
(then the weights matter only through an ``epoch_size`` below the dataset size). The snapshot
is part of `state_dict`, so a run resumed mid-epoch redraws the same order even though the live weights have moved since, and the `ResumableLoader` then skips
the batches already consumed: the same prompts as without the stop. As an `EpochSampler`
(a ``DistributedSampler`` subclass) it cuts the order into global batches across ranks and
Lightning keeps it instead of inserting its own distributed sampler. Weights must be equal on
every rank (the curriculum callback gathers its statistics across ranks).

Hooked in through ``PromptDataModule.train_sampler`` (None: the plain `EpochSampler`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler


class EpochSampler(DistributedSampler):
    """Prompt order for one rank: seeded by ``seed + epoch`` and cut into *global* batches.

    Global batch k holds the same prompts whatever the number of ranks: rank r of w takes slice
    ``[k·B + r·b, k·B + (r+1)·b)`` of the epoch's permutation, with b the per-rank and
    B = w·b the global batch size. So a 2-process run trains on exactly the prompts of a
    1-process run with twice the batch size. With several ranks an incomplete last global
    batch is dropped, so every rank runs the same number of steps. A ``DistributedSampler``
    subclass, so Lightning keeps it instead of wrapping it in its own.
    """

    def __init__(self, n: int, shuffle: bool, seed: int, batch_size: int = 1):
        self.n, self.shuffle, self.seed, self.batch_size, self.epoch = n, shuffle, seed, batch_size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @staticmethod
    def _layout() -> tuple[int, int]:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def __iter__(self) -> Iterator[int]:
        rank, world = self._layout()
        order, b = self._order(), self.batch_size
        if world == 1:
            return iter(order)
        step = world * b
        full = (self.n // step) * step
        return iter([order[k + rank * b + j] for k in range(0, full, step) for j in range(b)])

    def __len__(self) -> int:
        rank, world = self._layout()
        return self.n if world == 1 else (self.n // (world * self.batch_size)) * self.batch_size


class WeightedEpochSampler(EpochSampler):
    """Args:
        dataset_size: prompts in the training set.
        weights: callable returning the current ``[dataset_size]`` non-negative weights.
        seed / batch_size: as `EpochSampler` (per-rank batch size).
        epoch_size: prompts per epoch (default ``dataset_size``); smaller epochs refresh the
            weights more often. Without replacement, at most the number of prompts with a
            positive weight.
        replacement: draw with replacement (default; the weights set how often a prompt is
            trained on) or without (each prompt at most once per epoch).

    Examples:
        >>> s = WeightedEpochSampler(4, lambda: torch.tensor([0., 1., 1., 0.]), seed=0, batch_size=2, epoch_size=2,
        ...                          replacement=False)
        >>> s.set_epoch(0); sorted(s)
        [1, 2]
    """

    def __init__(self, dataset_size: int, weights: Callable[[], torch.Tensor], seed: int, batch_size: int = 1,
                 epoch_size: int | None = None, replacement: bool = True):
        epoch_size = dataset_size if epoch_size is None else epoch_size
        if not 1 <= epoch_size <= dataset_size:
            raise ValueError(f"epoch_size must be in [1, {dataset_size}] (got {epoch_size})")
        super().__init__(epoch_size, shuffle=True, seed=seed, batch_size=batch_size)
        self.dataset_size, self.weights, self.replacement = dataset_size, weights, replacement
        self.snapshot: torch.Tensor | None = None
        self.snapshot_epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self.snapshot_epoch != epoch:
            w = torch.as_tensor(self.weights(), dtype=torch.float64).clone()
            if w.shape != (self.dataset_size,) or not torch.isfinite(w).all() or (w < 0).any():
                raise ValueError(f"sampling weights must be {self.dataset_size} finite non-negative values")
            if w.sum() <= 0:
                raise ValueError("every sampling weight is 0: give the curriculum a min_weight > 0")
            if not self.replacement and int((w > 0).sum()) < self.n:
                raise ValueError(f"only {int((w > 0).sum())} prompts have a positive weight, fewer than epoch_size={self.n}: "
                                 "give the curriculum a min_weight > 0")
            self.snapshot, self.snapshot_epoch = w, epoch

    def _order(self) -> list[int]:
        if self.snapshot_epoch != self.epoch:
            self.set_epoch(self.epoch)
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.multinomial(self.snapshot, self.n, replacement=self.replacement, generator=g).tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "snapshot_epoch": self.snapshot_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.snapshot, self.snapshot_epoch = state["snapshot"], state["snapshot_epoch"]
