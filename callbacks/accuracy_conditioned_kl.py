"""FG-ExPO AKL: a KL coefficient that tightens as batch accuracy rises."""
from __future__ import annotations

import math
from typing import Any

from lightning_rlpt.hooks import RLCallback
from lightning_rlpt.model.distributed import reduce_over_ranks

from ._common import log_metrics, require, require_reference


class AccuracyConditionedKL(RLCallback):
    """Set ``kl_coef`` from the rollout's accuracy: loose while the policy fails, tight once it
    succeeds (FG-ExPO's accuracy-conditioned KL, arXiv 2605.11403; docs/callbacks.md).

    The paper fixes only "smooth and monotone"; this callback uses a logistic curve

        ``β(a) = kl_min + (kl_max − kl_min)·σ(steepness·(a − midpoint))``,

    with ``a`` the fraction of the rollout's completions whose raw weighted score (before any
    dithering) reaches the module's ``success_threshold``, averaged over ranks and optionally
    smoothed, ``a_s ← smoothing·a_s + (1 − smoothing)·a`` (first rollout: ``a_s = a``).
    The callback **sets ``module.knobs.kl_coef``** for every optimizer step of the rollout
    (``on_before_loss``); per-response ``kl_weights`` (e.g. `ResponseWeightedKL`) still multiply it.
    It claims the ``kl_coef`` knob: another callback moving it (`EntropyGatedKL`) is refused at setup.
    The accuracy counts every scored completion, truncated ones included: a truncated answer is a
    failed attempt even when ``mask_truncated_completions`` keeps it out of the loss.

    Args:
        kl_min / kl_max: β at very low / very high accuracy (0.0 and 0.05; ``0 <= kl_min <= kl_max``).
        midpoint: the accuracy where β is half-way (0.5, in [0, 1]).
        steepness: slope k of the logistic (10, > 0: β increases with accuracy).
        smoothing: EMA factor of the accuracy in [0, 1) (0: this rollout's accuracy).

    Logs ``akl/accuracy`` (this rollout), ``akl/accuracy_smoothed`` and ``akl/kl_coef``.

    Examples:
        >>> from lightning_rlpt.callbacks import AccuracyConditionedKL
        >>> akl = AccuracyConditionedKL(kl_min=0.0, kl_max=0.1, midpoint=0.5, steepness=10)
        >>> round(akl.coefficient(0.5), 4), round(akl.coefficient(0.9), 4)
        (0.05, 0.0982)
    """

    requires = ("knobs", "use_reference", "success_threshold")

    def __init__(self, kl_min: float = 0.0, kl_max: float = 0.05, midpoint: float = 0.5, steepness: float = 10.0,
                 smoothing: float = 0.0):
        require(0 <= kl_min <= kl_max, f"need 0 <= kl_min <= kl_max (got kl_min={kl_min}, kl_max={kl_max}: inverted?)")
        require(0 <= midpoint <= 1, f"midpoint is an accuracy and must be in [0, 1] (got {midpoint})")
        require(steepness > 0, f"steepness must be > 0 so the coefficient rises with accuracy (got {steepness})")
        require(0 <= smoothing < 1, f"smoothing must be in [0, 1) (got {smoothing})")
        self.kl_min, self.kl_max, self.midpoint, self.steepness, self.smoothing = kl_min, kl_max, midpoint, steepness, smoothing
        self.accuracy: float | None = None
        self.kl_coef: float | None = None

    def coefficient(self, accuracy: float) -> float:
        """β(a) of the class docstring."""
        z = self.steepness * (accuracy - self.midpoint)
        return self.kl_min + (self.kl_max - self.kl_min) / (1 + math.exp(-z))

    def observe(self, accuracy: float) -> float:
        """Update the smoothed accuracy with one rollout's and return the new coefficient."""
        s = self.smoothing
        self.accuracy = accuracy if self.accuracy is None else s * self.accuracy + (1 - s) * accuracy
        self.kl_coef = self.coefficient(self.accuracy)
        return self.kl_coef

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        require_reference(pl_module, "AccuracyConditionedKL")
        pl_module.knobs.claim("kl_coef", owner=self, trainer=trainer)

    def on_rewards_computed(self, trainer, module, experience):
        if len(experience) == 0:  # filtered away: keep the current coefficient
            return
        correct = experience.scores >= module.success_threshold
        accuracy = reduce_over_ranks(trainer, [correct.float().mean().item()], "mean")[0]
        coef = self.observe(accuracy)
        log_metrics(module, "akl", {"accuracy": accuracy, "accuracy_smoothed": self.accuracy, "kl_coef": coef})

    def on_before_loss(self, trainer, module, minibatch):
        if self.kl_coef is not None:
            module.knobs.kl_coef = self.kl_coef

    def state_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "kl_coef": self.kl_coef}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.accuracy, self.kl_coef = state_dict["accuracy"], state_dict["kl_coef"]
