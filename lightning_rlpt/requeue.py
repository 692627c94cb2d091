"""SLURM's requeue signal, acted on at a batch boundary.

With ``SLURMEnvironment(auto_requeue=True)`` Lightning saves its HPC checkpoint and runs
``scontrol requeue`` inside the signal handler, wherever the signal lands: in the middle of a
rollout or an optimizer step. That checkpoint holds a half-done step (the requeued job skipped
it) and, with several ranks, its save runs collectives from inside a handler while the other
ranks are in the step's own. `BatchBoundaryRequeue` takes the signal over for the fit: the
handler only notes it; at the end of each batch the ranks agree whether any rank got it, and if
so every rank runs Lightning's own handler there (loggers finalized, ``hpc_ckpt_<n>.ckpt``
saved, ``scontrol requeue`` from rank 0) and the fit stops. The checkpoint is the one
``ModelCheckpoint`` would write at that batch, so the requeued job resumes exactly.

The cost: one all-reduce of a boolean per batch, only under SLURM auto-requeue.
"""
from __future__ import annotations

import signal
import threading
from typing import Any

from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn


class BatchBoundaryRequeue:
    """Install with `install` at fit start; call `at_batch_end` from ``on_train_batch_end``."""

    def __init__(self, trainer: Any, signum: int, requeue: Any) -> None:
        self.trainer, self.signum, self.requeue = trainer, signum, requeue
        self.received = False
        signal.signal(signum, self._note)  # Lightning's teardown restores the handler it found before fit

    @classmethod
    def install(cls, trainer: Any) -> BatchBoundaryRequeue | None:
        """Take SLURM's requeue signal over when the trainer runs under SLURM with auto-requeue
        (Lightning's handler, which saves mid-step, is kept to be run at the boundary); None otherwise."""
        # where Lightning's signal connector reads it (a single-device strategy has no cluster_environment)
        environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        if not (isinstance(environment, SLURMEnvironment) and environment.auto_requeue):
            return None
        signum = environment.requeue_signal or getattr(signal, "SIGUSR1", None)
        requeue = getattr(getattr(trainer, "_signal_connector", None), "_slurm_sigusr_handler_fn", None)
        if signum is None or threading.current_thread() is not threading.main_thread():
            return None
        if requeue is None:  # another Lightning: its handler stays, and saves where the signal lands
            rank_zero_warn("lightning_rlpt: this Lightning has no _slurm_sigusr_handler_fn, so SLURM's requeue "
                           "signal is left to Lightning, which saves its HPC checkpoint mid-step (not an exact resume)")
            return None
        return cls(trainer, signum, requeue)

    def _note(self, signum: int, _frame: Any) -> None:
        self.received = True  # nothing else here: the step in progress finishes first

    def at_batch_end(self) -> None:
        """If any rank got the signal: save the HPC checkpoint, requeue, and stop the fit."""
        if not self.trainer.strategy.reduce_boolean_decision(self.received, all=False):
            return
        rank_zero_info(f"lightning_rlpt: SLURM's requeue signal ({signal.Signals(self.signum).name}) arrived; saving "
                       f"the HPC checkpoint at the end of step {self.trainer.global_step} and requeueing the job")
        self.received = False
        self.requeue(self.signum, None)
        self.trainer.should_stop = True  # the job is requeued: steps taken now would be lost
