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
   (μ > 1, several mini-batches) or a callback asked ``module.request(old_logprobs=True)`` in
   ``setup``. Set ``sample_weights``, ``token_weights`` or ``kl_weights`` here.
5. ``on_before_loss(trainer, module, minibatch)`` — once per optimizer step, on the
   mini-batch about to be trained on; the place to move ``module.knobs`` (``kl_coef``,
   ``clip_low``, ``clip_high``) for this step.

Controllers (anything that updates a coefficient from a batch) update once per training batch:
in ``on_rewards_computed``, ``on_advantages_computed`` or Lightning's batch hooks, never in
hooks 1–2, which also see refills. A hook edits the experience in place and returns None, or
returns a replacement. Optimizer moments (``on_before_optimizer_step``, ``on_train_batch_end``)
are Lightning's own hooks.

What a callback may touch on the module is `PUBLIC_SURFACE` (each callback lists what it uses
in ``requires``, checked at ``setup``): the `Knobs` it may move, the `Requests` it may make, one
method for the policy's log-probs, one for refill rollouts, the mask of the tokens the loss trains
on (``module.loss_mask(experience)``: statistics over any other tokens would measure what the loss
does not see), and read-only facts about the run. A knob has one owner: a callback that moves one
claims it in ``setup`` (``module.knobs.claim(name, owner=self, trainer=trainer)``).
"""
from __future__ import annotations

from typing import Any

import lightning as L

from .experience import Experience

HOOKS = ("on_rollout_end", "on_rollout_scored", "on_rewards_computed", "on_advantages_computed", "on_before_loss")

# The part of RLModule callbacks may use (besides LightningModule's own API, e.g. ``log``).
PUBLIC_SURFACE = (
    "knobs", "request",                                   # move knobs, ask for tensors
    "policy_logprobs", "refill", "sync_engine",           # act
    "probe_rejoined",                                     # the parity probe on a server back after a drop
    "loss_mask",                                          # the tokens the loss trains on (measure over these)
    "policy", "reference", "use_reference", "tokenizer",  # the models (ReferenceReset, VLLMRollout)
    "rollout_engine", "sampling", "val_sampling",         # the engine and its settings (VLLMRollout)
    "objective", "group_size", "success_threshold", "reward_names", "policy_version", "episodes",  # facts
)


class RLHookCaller:
    """Marks a LightningModule that calls the RL hooks (`RLModule`): RL callbacks check for it,
    since on any other module they would silently do nothing."""


class RLCallback(L.Callback):
    """Base class for callbacks that act on RL moments (see the module docstring for the order).

    ``requires`` names the parts of `PUBLIC_SURFACE` a subclass uses; ``setup`` checks them
    (subclasses that override ``setup`` call ``super().setup`` first), so a callback on a
    module that lacks them fails before any work, instead of silently doing nothing.

    Examples:
        >>> class ClampRewards(RLCallback):
        ...     def on_rewards_computed(self, trainer, module, experience):
        ...         experience.rewards.clamp_(0, 1)
    """

    requires: tuple[str, ...] = ()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_module(self, pl_module)

    def on_rollout_end(self, trainer: L.Trainer, module: Any, experience: Experience) -> Experience | None:
        return None

    def on_rollout_scored(self, trainer: L.Trainer, module: Any, experience: Experience) -> Experience | None:
        return None

    def on_rewards_computed(self, trainer: L.Trainer, module: Any, experience: Experience) -> Experience | None:
        return None

    def on_advantages_computed(self, trainer: L.Trainer, module: Any, experience: Experience) -> Experience | None:
        return None

    def on_before_loss(self, trainer: L.Trainer, module: Any, minibatch: Experience) -> Experience | None:
        return None


def check_module(callback: L.Callback, module: Any) -> None:
    """Raise if ``module`` cannot run ``callback``: a missing part of the surface, or no RL hooks."""
    name, kind = type(callback).__name__, type(module).__name__
    outside = [k for k in getattr(callback, "requires", ()) if k not in PUBLIC_SURFACE]
    if outside:
        raise TypeError(f"{name}.requires names {outside}, which are not part of RLModule's public surface "
                        f"(lightning_rlpt.hooks.PUBLIC_SURFACE)")
    missing = [k for k in getattr(callback, "requires", ()) if not hasattr(module, k)]
    if missing:
        raise ValueError(f"{name} uses module.{missing[0]}, which {kind} does not have (missing: {missing}); "
                         "use it with lightning_rlpt.RLModule")
    if not isinstance(module, RLHookCaller):  # only RLModule calls the RL hooks: the callback would do nothing
        raise ValueError(f"{name} acts at RLModule's hook points, which {kind} never calls: "
                         "use it with lightning_rlpt.RLModule (or a subclass)")


def rl_callbacks(trainer: Any) -> list[RLCallback]:
    callbacks = getattr(trainer, "callbacks", None) or []
    return [cb for cb in callbacks if isinstance(cb, RLCallback)]


def call_hook(trainer: Any, module: Any, hook: str, experience: Experience) -> Experience:
    """Run ``hook`` on every RL callback in Trainer order; a returned Experience replaces the input."""
    for cb in rl_callbacks(trainer):
        result = getattr(cb, hook)(trainer, module, experience)
        if result is not None:
            if not isinstance(result, Experience):
                raise TypeError(f"{type(cb).__name__}.{hook} returned {type(result).__name__}; return an Experience or None")
            experience = result
    return experience
