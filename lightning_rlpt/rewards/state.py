"""`TrainerState`: what reward functions receive as ``trainer_state``, under TRL's field names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainerState:
    """The training progress a reward sees, so rewards written for TRL (which passes its
    ``transformers.TrainerState``) can shape themselves by it, e.g. a curriculum on ``global_step``.

    Only the fields of TRL's state that a Lightning ``Trainer`` knows are filled, under TRL's
    names. ``epoch`` is the epoch count as a float; TRL's is fractional (the part of the epoch done),
    Lightning's counter is whole, so here it is the whole epoch.

    Args:
        global_step: optimizer steps taken so far (Lightning's ``trainer.global_step``).
        epoch: epochs completed (``trainer.current_epoch``).
        max_steps: the step budget (``trainer.max_steps``; -1 when unset, as in Lightning).
        num_train_epochs: the epoch budget (``trainer.max_epochs``; None when unset).

    Examples:
        >>> def curriculum(completions, trainer_state, **_):
        ...     return [float(len(c) <= 10 + trainer_state.global_step) for c in completions]
        >>> curriculum(["short"], trainer_state=TrainerState(global_step=3))
        [1.0]
    """

    global_step: int = 0
    epoch: float = 0.0
    max_steps: int = -1
    num_train_epochs: int | None = None

    @classmethod
    def of(cls, trainer: Any) -> "TrainerState":
        """The state of a Lightning ``trainer`` (the defaults when it is None: a module used alone)."""
        if trainer is None:
            return cls()
        return cls(global_step=int(trainer.global_step), epoch=float(trainer.current_epoch),
                   max_steps=int(trainer.max_steps), num_train_epochs=trainer.max_epochs)
