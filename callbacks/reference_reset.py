"""Move the KL reference during training: validation-anchored resets, soft and hard syncs."""
from __future__ import annotations

import operator
from typing import Any

import torch

from lightning_rlpt.hooks import RLCallback
from lightning_rlpt.model.loading import add_reference_adapter, is_peft, reference_pairs

from ._common import log_metrics, require, require_reference

MODES = ("best", "soft", "hard")


class ReferenceReset(RLCallback):
    """Re-anchor the reference policy (REVA-PO's VAPR and TR-DPO's syncs; formulas in docs/callbacks.md).

    - ``mode="best"`` — REVA-PO's validation-anchored policy reset (VAPR, LiGuo12/REVA_PO):
      after each validation the policy is remembered if ``monitor`` improved; every
      ``every_n_validations`` validations (never at the first one unless N = 1) the
      best-validation policy is loaded into the policy *and* the reference, and, with
      ``reset_optimizer``, the optimizer state (Adam moments) is cleared. The old policy follows,
      since old log-probs are recomputed from the policy at each rollout.
    - ``mode="soft"`` — TR-DPO (Gorbatovski et al., "Learn Your Reference Model for Real Good
      Alignment", arXiv 2404.09656) / TRL's ``sync_ref_model``: ``ref ← α·θ + (1 − α)·ref`` every
      ``every_n_steps`` optimizer steps (TRL: α 0.6, τ 512). With a small α and
      ``every_n_steps=1`` this is WARP's EMA anchor (Ramé et al., arXiv 2406.16768).
    - ``mode="hard"`` — ``ref ← θ`` every ``every_n_steps`` optimizer steps.

    Steps are checked after each training batch (``on_train_batch_end``), so with several
    optimizer steps per rollout a sync happens at the first batch end at or past the multiple.

    Full fine-tuning moves the frozen copy ``module.reference``. Under LoRA/QLoRA (where the
    reference is otherwise the base with adapters disabled) ``setup`` adds a frozen second peft
    adapter named ``reference`` (``lightning_rlpt.model.loading.add_reference_adapter``), which the
    module's ``reference_context`` then activates for reference log-probs; its ``lora_B`` starts
    at zero, so until it is first moved it *is* the base. Updates copy the policy adapter's
    factors into it (the soft mode interpolates A and B, not their product). Both the copy and
    the best snapshot (trainable weights only, on CPU) are saved in the checkpoint.

    Args:
        mode: ``best``, ``soft`` or ``hard``.
        monitor: the validation metric for ``best`` (``val/accuracy``); ``monitor_mode``:
            ``max`` (higher is better) or ``min``.
        every_n_validations: validations between VAPR resets (3, REVA-PO's ``update_ref_every``).
        reset_optimizer: clear the optimizer state at a VAPR reset (True, as REVA-PO).
        every_n_steps: optimizer steps between syncs in ``soft``/``hard`` mode (512).
        alpha: the soft mixing weight α in (0, 1] (0.6).

    Logs ``ref_reset/best`` (best monitored value), ``ref_reset/resets`` and ``ref_reset/syncs``
    (counts so far).

    Examples:
        >>> from lightning_rlpt.callbacks import ReferenceReset
        >>> vapr = ReferenceReset(mode="best", monitor="val/accuracy", every_n_validations=3)
        >>> trpo = ReferenceReset(mode="soft", alpha=0.6, every_n_steps=512)
    """

    requires = ("policy", "reference", "use_reference", "sync_engine")

    def __init__(self, mode: str = "best", monitor: str = "val/accuracy", monitor_mode: str = "max",
                 every_n_validations: int = 3, reset_optimizer: bool = True, every_n_steps: int = 512,
                 alpha: float = 0.6):
        require(mode in MODES, f"mode must be one of {MODES} (got {mode!r})")
        require(monitor_mode in ("max", "min"), f"monitor_mode must be 'max' or 'min' (got {monitor_mode!r})")
        require(every_n_validations >= 1, f"every_n_validations must be >= 1 (got {every_n_validations})")
        require(every_n_steps >= 1, f"every_n_steps must be >= 1 (got {every_n_steps})")
        require(0 < alpha <= 1, f"alpha must be in (0, 1] (got {alpha})")
        self.mode, self.monitor, self.monitor_mode = mode, monitor, monitor_mode
        self.every_n_validations, self.reset_optimizer = every_n_validations, reset_optimizer
        self.every_n_steps, self.alpha = every_n_steps, alpha
        self.best_score: float | None = None
        self.best_weights: dict[str, torch.Tensor] | None = None
        self.validations = self.resets = self.syncs = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(mode=self.mode, monitor=self.monitor)

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        require_reference(pl_module, "ReferenceReset")
        if is_peft(pl_module.policy) and pl_module.reference is None:
            add_reference_adapter(pl_module.policy)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.mode != "best":
            return
        datamodule = getattr(trainer, "datamodule", None)
        no_val = trainer.limit_val_batches == 0 or (datamodule is not None and hasattr(datamodule, "val_set")
                                                    and datamodule.val_set is None)
        if no_val:
            raise ValueError(f"ReferenceReset(mode='best') resets to the best {self.monitor!r} seen in validation, but "
                             "this fit has no validation loop: give PromptDataModule val_data= (or val_fraction=) "
                             "and let validation run (limit_val_batches > 0), or use mode='soft'/'hard'")

    # ------------------------------------------------------------------ VAPR
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.mode != "best" or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if self.monitor not in trainer.callback_metrics:
            raise ValueError(f"ReferenceReset monitors {self.monitor!r}, which validation did not log; logged metrics: "
                             f"{sorted(trainer.callback_metrics)}. Pass monitor= one of the val/ metrics")
        score = float(trainer.callback_metrics[self.monitor])
        better = operator.gt if self.monitor_mode == "max" else operator.lt
        if self.best_score is None or better(score, self.best_score):
            self.best_score = score
            self.best_weights = {n: p.detach().to("cpu", copy=True) for n, p in pl_module.policy.named_parameters()
                                 if p.requires_grad}
        self.validations += 1
        if self.validations % self.every_n_validations == 0:
            self._reset_to_best(trainer, pl_module)

    @torch.no_grad()
    def _reset_to_best(self, trainer: Any, pl_module: Any) -> None:
        params = dict(pl_module.policy.named_parameters())
        for name, value in self.best_weights.items():
            params[name].copy_(value)
        self._move_reference(pl_module, alpha=1.0)
        if self.reset_optimizer:
            for optimizer in trainer.optimizers:
                optimizer.state.clear()
        pl_module.sync_engine()
        self.resets += 1

    # ------------------------------------------------------------------ soft / hard syncs
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.mode != "best":
            due = trainer.global_step // self.every_n_steps
            if due > self.syncs:
                self._move_reference(pl_module, alpha=self.alpha if self.mode == "soft" else 1.0)
                self.syncs = due
        values = {"resets": self.resets, "syncs": self.syncs}
        if self.best_score is not None:
            values["best"] = self.best_score
        log_metrics(pl_module, "ref_reset", values)

    @torch.no_grad()
    def _move_reference(self, pl_module: Any, alpha: float) -> None:
        """``ref ← α·θ + (1 − α)·ref`` (α = 1: a copy)."""
        for theta, ref in reference_pairs(pl_module.policy, pl_module.reference):
            if alpha == 1.0:
                ref.copy_(theta)
            else:
                ref.lerp_(theta.to(device=ref.device, dtype=ref.dtype), alpha)  # a bf16 or offloaded reference

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score, "best_weights": self.best_weights, "validations": self.validations,
                "resets": self.resets, "syncs": self.syncs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key, value in state_dict.items():
            setattr(self, key, value)
