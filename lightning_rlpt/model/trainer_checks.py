"""The Trainer's own optimization knobs, as an `RLModule` (manual optimization) reads them.

Lightning refuses ``Trainer(gradient_clip_val=...)`` and ``Trainer(accumulate_grad_batches=...)``
under manual optimization, suggesting automatic optimization, which an RL module cannot use.
`adopt_trainer_knobs` runs before that check (from ``configure_callbacks``, the one module hook
Lightning calls before it) and:

- honours ``gradient_clip_val=c`` (algorithm ``"norm"``, Lightning's default) as the module's
  ``max_grad_norm=c``, then clears the Trainer's value so Lightning's check passes;
- refuses ``gradient_clip_algorithm="value"``, with or without a value (the module clips the
  global norm only, and Lightning would reject that clipping under it at the first step);
- refuses ``accumulate_grad_batches != 1``: the module steps the optimizer once per mini-batch of
  each rollout, so the knobs for a bigger step are the rollout's size and ``minibatch_size``, and
  ``micro_batch_size`` / ``max_tokens_per_micro_batch`` accumulate gradients within a step to fit
  memory (the step's gradient stays the one-pass gradient of the mini-batch).
"""
from __future__ import annotations

import inspect
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.enums import GradClipAlgorithmType


def adopt_trainer_knobs(module: Any) -> None:
    """Take the Trainer's clipping into ``module.hparams.max_grad_norm``, or refuse what the
    module cannot honour, before Lightning's manual-optimization check.

    Args:
        module: the `RLModule` being fit (attached to its Trainer).

    Raises:
        ValueError: ``accumulate_grad_batches`` != 1, ``gradient_clip_algorithm="value"``, or a
            ``gradient_clip_val`` that contradicts a ``max_grad_norm`` set on the module.
    """
    trainer = module._trainer
    if trainer is None or trainer.state.fn != TrainerFn.FITTING:
        return
    if trainer.accumulate_grad_batches != 1:
        raise ValueError(
            f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) is not supported by RLModule, "
            "which steps the optimizer once per mini-batch of each rollout: remove it. For more rows per "
            "step raise the rollout's size (the data's batch_size × group_size) or minibatch_size; to fit "
            "memory, micro_batch_size / max_tokens_per_micro_batch accumulate gradients within a step")
    if trainer.gradient_clip_algorithm == GradClipAlgorithmType.VALUE:  # refused even without a value:
        # Lightning's clip_gradients would reject the module's norm clipping at the first step
        raise ValueError(
            "Trainer(gradient_clip_algorithm='value') is not supported by RLModule, which clips the gradients' "
            "global norm: drop it (gradient_clip_val then clips the norm) or use RLModule(max_grad_norm=...)")
    clip = trainer.gradient_clip_val
    if clip is None or clip <= 0:
        return
    default = _init_default(type(module), "max_grad_norm")
    current = module.hparams.max_grad_norm
    if current not in (default, clip):
        raise ValueError(
            f"Trainer(gradient_clip_val={clip}) and RLModule(max_grad_norm={current}) disagree: set one "
            "(both clip the gradients' global norm before each optimizer step)")
    module.hparams.max_grad_norm = float(clip)
    trainer.gradient_clip_val = None  # now the module's: Lightning's manual-optimization check passes


def _init_default(cls: type, name: str) -> Any:
    """The default of ``name`` in the nearest ``__init__`` of ``cls``'s MRO that takes it (a
    subclass's ``__init__(**kwargs)`` passes it on to RLModule's)."""
    for klass in cls.__mro__:
        param = inspect.signature(klass.__init__).parameters.get(name) if "__init__" in vars(klass) else None
        if param is not None:
            return param.default
    return None
