"""The training progress bar of an RL fit counts optimizer steps against ``Trainer(max_steps=)``.

Lightning's bar counts batches and caps the total at the steps left, assuming one optimizer
step per batch. An `RLModule` batch is a rollout, trained on in several optimizer steps
(``updates_per_rollout`` passes of mini-batches), so the bar read "6/1" or stopped at "2/8"
when the run ended, and with ``max_steps`` alone (``max_epochs`` -1) its title read
"Epoch 0/-2" (issue 26, item 9). `count_steps` (from ``RLModule.configure_callbacks``) turns
the Trainer's bar, when it is one of Lightning's two (``RichProgressBar``, ``TQDMProgressBar``),
into the same class with `StepCounting` mixed in:

- with ``max_steps`` set, the bar shows ``global_step / max_steps`` (what ends the run, in the
  unit ``max_steps`` counts, as TRL's bar does);
- without it (``max_epochs`` only), the bar counts the epoch's rollouts, as Lightning's does;
- the title is "Epoch N", and "Epoch N/M" only when ``max_epochs`` is set;
- the logger's version (``v_num``) is not drawn among the metrics.

A progress bar class of the user's own is left alone, and so is ``enable_progress_bar=False``.
"""
from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


def counts_steps(trainer: Any) -> bool:
    """Whether the run ends at ``max_steps`` (then the bar counts optimizer steps)."""
    return trainer.max_steps is not None and trainer.max_steps > 0


class StepCounting:
    """Mixin for Lightning's progress bars: the training bar's total and position in optimizer
    steps when ``max_steps`` is set (rollouts otherwise), and no "/-2" in its title."""

    trainer: Any

    @property
    def total_train_batches(self) -> int | float:
        if counts_steps(self.trainer):
            return self.trainer.max_steps
        return self.trainer.num_training_batches

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning's bars draw position ``batch_idx + 1``: hand them the step count instead.
        position = trainer.global_step if counts_steps(trainer) else batch_idx + 1
        super().on_train_batch_end(trainer, pl_module, outputs, batch, position - 1)  # type: ignore[misc]

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        items.pop("v_num", None)  # the logger's version, drawn as a metric ("v_num: 0.000") beside the RL ones
        return items

    def _get_train_description(self, current_epoch: int) -> str:  # RichProgressBar's title
        if self.trainer.max_epochs is not None and self.trainer.max_epochs > 0:
            return super()._get_train_description(current_epoch)  # type: ignore[misc]
        return f"Epoch {current_epoch}"


class RichStepProgressBar(StepCounting, RichProgressBar):
    """``RichProgressBar`` counting optimizer steps (see `StepCounting`)."""


class TQDMStepProgressBar(StepCounting, TQDMProgressBar):
    """``TQDMProgressBar`` counting optimizer steps (see `StepCounting`)."""


STEP_BARS = {RichProgressBar: RichStepProgressBar, TQDMProgressBar: TQDMStepProgressBar}


def count_steps(trainer: Any) -> None:
    """Make the Trainer's progress bar count optimizer steps, if it is exactly one of Lightning's.

    The bar's class is swapped in place rather than the bar replaced: it keeps every setting the
    user gave it (refresh rate, theme, ``leave``), the mixin adds no state, and returning a new bar
    from ``configure_callbacks`` would print Lightning's notice that it overrides the Trainer's.

    Args:
        trainer: the Trainer about to fit an `RLModule`.
    """
    bar = getattr(trainer, "progress_bar_callback", None)
    step_bar = STEP_BARS.get(type(bar))
    if step_bar is not None:
        bar.__class__ = step_bar
