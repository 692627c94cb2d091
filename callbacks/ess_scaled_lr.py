"""VCPO: scale the learning rate by the effective sample size of the off-policy batch."""
from __future__ import annotations

import math
from typing import Any

import torch

from lightning_rlpt.algorithms.correction import sequence_weights
from lightning_rlpt.hooks import RLCallback
from lightning_rlpt.model.distributed import reduce_over_ranks

from ._common import log_metrics, require, trained_rows

RULES = ("sqrt", "linear")
# Where the min-variance baseline lives now: the module's estimator, which sees the IS weights itself.
MOVED_BASELINE = ("ESSScaledLR no longer replaces the advantages (baseline={baseline!r}, grad_norm_proxy={proxy!r}): "
                  "select VCPO's baseline as the module's estimator instead, RLModule(advantage="
                  "'min_variance_offpolicy'{kwargs}), and build ESSScaledLR without baseline/grad_norm_proxy")


class ESSScaledLR(RLCallback):
    """Shrink the step when the importance weights are degenerate (VCPO, "Variance-Controlled
    Policy Optimization", mit-han-lab/vcpo; formulas in docs/callbacks.md).

    Per optimizer step, on the mini-batch about to be trained on (captured in
    ``on_before_loss``): sequence weights ``w_i = exp(Σ_t mask·(logπ_old − logπ_behaviour))``
    (the learner's recomputed log-probs over the rollout engine's; the log-weight is clamped to
    ±20), summed over all data-parallel ranks into ``ESS = (Σw)²/(Σw² + 1e-8)`` and
    ``ρ = ESS/B`` (B = sequences in the global mini-batch). ``lr_scale = min(1, ρ/ρ_base)``;
    the ``sqrt`` rule multiplies every param group's LR by ``√lr_scale``, ``linear`` by
    ``lr_scale``. The scaling is applied in Lightning's ``on_before_optimizer_step`` and undone
    by a one-shot ``optimizer.register_step_post_hook`` right after ``optimizer.step()`` (and,
    as a fallback, in ``on_train_batch_end``), so schedulers, LR monitors and checkpoints only
    ever see the base LR. When ``ρ ≥ ρ_base·(1 − tolerance)`` the LR is left exactly unchanged:
    on-policy data (``w ≡ 1`` up to kernel noise) does not move it. Only the tokens the loss
    trains on count (``module.loss_mask``): a row without any (a truncated row under
    ``mask_truncated_completions``) is not one of the B sequences, nor in the baseline.

    VCPO's minimum-variance off-policy baseline is an advantage estimator, not this callback's:
    ``RLModule(advantage="min_variance_offpolicy")`` (``advantage_kwargs={"grad_norm_proxy":
    "length"}`` for ‖g‖² ∝ length; ``lightning_rlpt.algorithms.advantages.min_variance`` derives
    it), paired with a sequence-level correction such as ``rollout_correction="seq_tis"``. The
    callback's former ``baseline="min_variance"`` (which overwrote the advantages after the fact)
    is refused, naming that replacement.

    Needs behaviour log-probs from the engine: it asks the module's HF engine for them
    (``module.request(rollout_logprobs=True)``); vLLM always reports them.

    Args:
        rule: ``sqrt`` (VCPO default) or ``linear``.
        rho_base: ρ at and above which the LR is not scaled (1.0).
        truncation: cap of the truncated weight copy ``min(w, truncation)`` (8.0).
        use_truncated: compute the ESS from the truncated copy (default False: untruncated).
        tolerance: relative slack on ``ρ_base`` below which scaling starts (1e-6).
        baseline / grad_norm_proxy: removed (None / ``none`` only); see above.

    Logs ``ess/ratio`` (ρ), ``ess/lr_scale`` (the factor applied to the LR),
    ``ess/weight_mean`` and ``ess/weight_max`` (untruncated), ``ess/truncated_weight_mean``.

    Examples:
        >>> import torch
        >>> from lightning_rlpt.callbacks import ESSScaledLR
        >>> ess = ESSScaledLR(rule="linear")
        >>> ratio, factor = ess.scale_for(torch.tensor([1.0, 1.0, 0.0, 0.0]))
        >>> round(ratio, 4), round(factor, 4)
        (0.5, 0.5)
    """

    requires = ("request", "rollout_engine", "loss_mask")

    def __init__(self, rule: str = "sqrt", rho_base: float = 1.0, truncation: float = 8.0, use_truncated: bool = False,
                 tolerance: float = 1e-6, baseline: str | None = None, grad_norm_proxy: str = "none"):
        require(rule in RULES, f"rule must be one of {RULES} (got {rule!r})")
        require(0 < rho_base <= 1, f"rho_base must be in (0, 1] (got {rho_base})")
        require(truncation > 0, f"truncation must be > 0 (got {truncation})")
        require(0 <= tolerance < 1, f"tolerance must be in [0, 1) (got {tolerance})")
        kwargs = ", advantage_kwargs={'grad_norm_proxy': 'length'}" if grad_norm_proxy == "length" else ""
        require(baseline is None and grad_norm_proxy == "none",
                MOVED_BASELINE.format(baseline=baseline, proxy=grad_norm_proxy, kwargs=kwargs))
        self.rule, self.rho_base, self.truncation, self.use_truncated = rule, rho_base, truncation, use_truncated
        self.tolerance = tolerance
        self._factor: float | None = None  # for the coming optimizer step
        self._base_lrs: list[float] | None = None  # while the scaled LR is in place

    # ------------------------------------------------------------------ the formula
    def scale_for(self, weights: torch.Tensor, trainer: Any = None) -> tuple[float, float]:
        """(ρ, LR factor) for the global mini-batch whose local weights are ``weights``."""
        w = weights.clamp(max=self.truncation) if self.use_truncated else weights
        s1, s2, count = reduce_over_ranks(trainer, [w.sum().item(), (w ** 2).sum().item(), float(len(w))])
        if count == 0:  # no rank trains on any sequence: nothing to measure, the LR is left alone
            return float("nan"), 1.0
        ratio = (s1 ** 2 / (s2 + 1e-8)) / count
        if ratio >= self.rho_base * (1 - self.tolerance):
            return ratio, 1.0
        scale = min(1.0, ratio / self.rho_base)
        return ratio, math.sqrt(scale) if self.rule == "sqrt" else scale

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # the ESS is measured before the loss, from π_old / π_behaviour
        pl_module.request(old_logprobs=True, rollout_logprobs=True)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        engine = pl_module.rollout_engine  # None: the module's HF engine, which honours the request
        if engine is not None and not engine.return_logprobs:  # checked against the contract at fit start
            raise ValueError("ESSScaledLR needs behaviour log-probs from the rollout engine, and this "
                             f"{type(engine).__name__} does not report them: build it with return_logprobs=True, "
                             "leave the module's own engine (RLModule(..., rollout_logprobs=True)), or roll out with "
                             "VLLMRollout")

    def on_before_loss(self, trainer, module, minibatch):
        self._restore(trainer)
        mask = module.loss_mask(minibatch)
        weights = sequence_weights(self._old(minibatch), self._behaviour(minibatch), mask)
        weights = weights[trained_rows(mask).to(weights.device)]  # B counts the sequences trained on
        ratio, self._factor = self.scale_for(weights, trainer)
        log_metrics(module, "ess", {"ratio": ratio, "lr_scale": self._factor, "weight_mean": weights.mean().item(),
                                    "weight_max": weights.max().item() if len(weights) else float("nan"),
                                    "truncated_weight_mean": weights.clamp(max=self.truncation).mean().item()})

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._factor is None or self._factor == 1.0:
            return
        self._base_lrs = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * self._factor
        self._optimizer = optimizer
        handle = None

        def restore(*_: Any) -> None:
            self._restore(trainer)
            handle.remove()

        handle = optimizer.register_step_post_hook(restore)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._restore(trainer)
        self._factor = None

    def _restore(self, trainer: Any) -> None:
        if self._base_lrs is not None:
            for group, lr in zip(self._optimizer.param_groups, self._base_lrs):
                group["lr"] = lr
            self._base_lrs = None

    @staticmethod
    def _behaviour(exp) -> torch.Tensor:
        if exp.behaviour_logprobs is None:
            raise ValueError("ESSScaledLR needs behaviour log-probs (experience.behaviour_logprobs is None): use "
                             "RLModule(..., rollout_logprobs=True) or the VLLMRollout callback")
        return exp.behaviour_logprobs

    @staticmethod
    def _old(exp) -> torch.Tensor:
        if exp.old_logprobs is None:
            raise RuntimeError("experience.old_logprobs is missing although behaviour log-probs are present")
        return exp.old_logprobs
