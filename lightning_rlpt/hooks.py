"""The RL hook protocol: named moments in a rollout's life where callbacks may act.

For every batch of prompts the module calls, in this order, on every `RLCallback` in the
order they are listed on the Trainer:

1. ``on_rollout_end(trainer, module, experience)`` — completions sampled and decoded;
   nothing scored yet. Runs on every rollout, refill rollouts of dynamic filtering included.
2. ``on_rollout_scored(trainer, module, experience)`` — ``rewards`` and ``rewards_per_func``
   set, untouched by any callback. The place to *assemble* the batch: record statistics of
   what was sampled (curricula) and return a smaller or refilled `Experience` (dynamic
   filtering). Refill rollouts are rolled out and scored, but not re-run through this hook.
3. ``on_rewards_computed(trainer, module, experience)`` — once per training batch, on the
   assembled batch. Per-sample reward transforms (reward dithering: every sample that enters
   the batch is transformed exactly once) and controllers that read the batch's rewards
   (accuracy-conditioned KL) act here, so their result does not depend on whether they are
   listed before or after a filter.
4. ``on_advantages_computed(trainer, module, experience)`` — ``advantages`` and
   ``ref_logprobs`` (with a reference) set; ``old_logprobs`` too when the rollout is reused
   (μ > 1, several mini-batches) or the callback set ``module.needs_old_logprobs`` in ``setup``. Set ``sample_weights``,
   ``token_weights`` or ``kl_weights`` here.
4. ``on_before_loss(trainer, module, minibatch)`` — once per optimizer step, on the
   mini-batch about to be trained on; the place to move the module's knobs
   (``kl_coef``, ``clip_low``, ``clip_high``) for this step.

Controllers (anything that updates a coefficient from a batch) update once per training batch:
in ``on_rewards_computed``, ``on_advantages_computed`` or Lightning's batch hooks, never in
hooks 1–2, which also see refills. A hook edits the experience in place and returns None, or
returns a replacement. Optimizer
moments (``on_before_optimizer_step``, ``on_train_batch_end``) are Lightning's own hooks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L

from .experience import Experience

if TYPE_CHECKING:
    from .module import RLModule

HOOKS = ("on_rollout_end", "on_rollout_scored", "on_rewards_computed", "on_advantages_computed", "on_before_loss")


class RLCallback(L.Callback):
    """Base class for callbacks that act on RL moments (see the module docstring for the order).

    ``knobs`` names the module's public attributes a subclass reads or moves; ``setup`` checks
    them (subclasses that override ``setup`` call ``super().setup`` first), so a callback on a
    module that lacks them fails before any work, instead of silently doing nothing.

    Example:
        >>> class ClampRewards(RLCallback):
        ...     def on_rewards_computed(self, trainer, module, experience):
        ...         experience.rewards.clamp_(0, 1)
    """

    knobs: tuple[str, ...] = ()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_knobs(self, pl_module)

    def on_rollout_end(self, trainer: L.Trainer, module: "RLModule", experience: Experience) -> Experience | None:
        return None

    def on_rollout_scored(self, trainer: L.Trainer, module: "RLModule", experience: Experience) -> Experience | None:
        return None

    def on_rewards_computed(self, trainer: L.Trainer, module: "RLModule", experience: Experience) -> Experience | None:
        return None

    def on_advantages_computed(self, trainer: L.Trainer, module: "RLModule", experience: Experience) -> Experience | None:
        return None

    def on_before_loss(self, trainer: L.Trainer, module: "RLModule", minibatch: Experience) -> Experience | None:
        return None


def check_knobs(callback: L.Callback, module: Any) -> None:
    """Raise if ``module`` cannot run ``callback``: a missing knob, or no RL hooks at all."""
    from .module import RLModule

    name, kind = type(callback).__name__, type(module).__name__
    missing = [k for k in getattr(callback, "knobs", ()) if not hasattr(module, k)]
    if missing:
        raise ValueError(f"{name} drives module.{missing[0]}, which {kind} does not have (missing: {missing}); "
                         "use it with lightning_rlpt.RLModule")
    if not isinstance(module, RLModule):  # only RLModule calls the RL hooks: the callback would do nothing
        raise ValueError(f"{name} acts at RLModule's hook points, which {kind} never calls: "
                         "use it with lightning_rlpt.RLModule (or a subclass)")


def rl_callbacks(trainer: Any) -> list[RLCallback]:
    callbacks = getattr(trainer, "callbacks", None) or []
    return [cb for cb in callbacks if isinstance(cb, RLCallback)]


def call_hook(trainer: Any, module: "RLModule", hook: str, experience: Experience) -> Experience:
    """Run ``hook`` on every RL callback in Trainer order; a returned Experience replaces the input."""
    for cb in rl_callbacks(trainer):
        result = getattr(cb, hook)(trainer, module, experience)
        if result is not None:
            if not isinstance(result, Experience):
                raise TypeError(f"{type(cb).__name__}.{hook} returned {type(result).__name__}; return an Experience or None")
            experience = result
    return experience
