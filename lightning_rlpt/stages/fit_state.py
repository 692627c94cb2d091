"""`FitState`: what each ``trainer.fit`` starts afresh, in one object the module replaces at fit
start, so a stage reads it without asking whether a fit has begun (a module used outside a fit,
as the stage tests use it, holds a fresh one from its constructor)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..requeue import BatchBoundaryRequeue
from .learning_signal import NoSignalWatch


@dataclass
class FitState:
    """``no_signal``: groups without learning signal, rollout after rollout (warns once a fit);
    ``requeue``: SLURM's auto-requeue moved to the batch boundary (None unless SLURM requeues)."""

    no_signal: NoSignalWatch = field(default_factory=NoSignalWatch)
    requeue: BatchBoundaryRequeue | None = None
