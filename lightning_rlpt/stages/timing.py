"""`StepTimer`: wall seconds of each stage of a training step (verl's ``timing/*`` names), and
`seconds_since` for the whole step (``step_time``)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch


class StepTimer:
    """Accumulates seconds per stage name until `pop`. On CUDA it synchronises at each edge, so
    asynchronous kernels are charged to the stage that launched them.

    Examples:
        >>> timer = StepTimer()
        >>> with timer("rollout"):
        ...     pass
        >>> sorted(timer.pop())
        ['timing/rollout']
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        _sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            _sync()
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        out = {f"timing/{k}": v for k, v in self.seconds.items()}
        self.seconds = {}
        return out


def seconds_since(start: float) -> float:
    """Wall seconds since ``start`` (a ``time.perf_counter()`` reading), CUDA work included."""
    _sync()
    return time.perf_counter() - start


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
