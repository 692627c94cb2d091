"""Warm-up schedules, as classes so a YAML config can name them: `WarmupCosineLR` (TRL's
``lr_scheduler_type="cosine_with_min_lr"`` with ``warmup_steps``) and `WarmupLinearLR` (TRL's
default ``lr_scheduler_type="linear"``).

Their length (``total_steps``) may be left out: `RLModule` then sets it to the optimizer steps the
Trainer will take (``max_steps``; see `optim.build.run_steps`), the LightningCLI convention of
``trainer.estimated_stepping_batches``. A checkpoint restores a schedule's position, never its
settings, so a run resumed with a larger ``max_steps`` follows the longer schedule from where it
stopped instead of sitting at the floor. Two cases warn: a resume whose longer run moves a
fractional warm-up past the restored step (the rate drops back into the warm-up), and epochs that
may end before ``max_steps`` when ``minibatch_size`` leaves the steps per rollout unknown.
"""
from __future__ import annotations

import math

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim.lr_scheduler import LambdaLR

# What a schedule is configured with: from the constructor and the run, never from a checkpoint.
SETTINGS = ("total_steps", "warmup_steps", "min_lr_ratio", "follows_run", "warmup_arg")


class _WarmupSchedule(LambdaLR):
    """Linear warm-up from 0 over ``warmup_steps`` optimizer steps, then ``decay`` from the base
    learning rate down to ``min_lr_ratio`` × it at ``total_steps``, flat after that.

    The factor at optimizer step ``s`` (0-based: the factor the s-th step uses) is
    ``s / warmup_steps`` during the warm-up (so the very first step, as in TRL, has learning rate
    0), then ``min_lr_ratio + (1 - min_lr_ratio) · decay(p)`` with
    ``p = min(1, (s - warmup_steps) / (total_steps - warmup_steps))``.
    """

    name = "schedule"

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int | None = None,
                 warmup_steps: int | float = 0, min_lr_ratio: float = 0.0, last_epoch: int = -1):
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, (int, float)) or warmup_steps < 0 \
                or (isinstance(warmup_steps, float) and warmup_steps >= 1 and not warmup_steps.is_integer()):
            raise ValueError(f"{self.name}: warmup_steps must be an int >= 0 (optimizer steps) or a float in [0, 1) "
                             f"(a fraction of total_steps, as in transformers), got {warmup_steps!r}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1] (got {min_lr_ratio})")
        self.warmup_arg, self.min_lr_ratio = warmup_steps, min_lr_ratio
        self.follows_run = total_steps is None
        self.total_steps, self.warmup_steps = None, None
        if total_steps is not None:
            self._set_length(total_steps)
        super().__init__(optimizer, self.factor, last_epoch=last_epoch)

    def _set_length(self, total_steps: int) -> None:
        warmup = self.warmup_arg
        warmup = math.ceil(total_steps * warmup) if isinstance(warmup, float) and warmup < 1 else int(warmup)
        if total_steps <= warmup:
            raise ValueError(f"{self.name} needs 0 <= warmup_steps < total_steps (got warmup_steps={warmup}, "
                             f"total_steps={total_steps}); total_steps counts optimizer steps, the Trainer's max_steps")
        self.total_steps, self.warmup_steps = int(total_steps), warmup

    def fit_to(self, run_steps: int | None) -> None:
        """Set the length to ``run_steps`` (the optimizer steps the run will take; None: unknown)
        when none was given, and re-apply the current step's learning rate; with a given
        ``total_steps`` shorter than the run, warn that the rate will sit at its floor."""
        if self.follows_run:
            if run_steps is None:
                raise ValueError(f"{self.name} has no total_steps and the run's length is unknown (no max_steps, or "
                                 "several mini-batches per rollout under max_epochs): set Trainer(max_steps=...) or "
                                 "pass total_steps=... to the schedule")
            self._set_length(run_steps)
            self._apply()
            if getattr(run_steps, "why", None):
                rank_zero_warn(f"{self.name} follows the run's max_steps={run_steps} optimizer steps, but {run_steps.why}"
                               ": the learning rate would then stop before its floor. Set Trainer(max_epochs=-1) to let "
                               "max_steps end the run, or pass total_steps=... to the schedule")
        elif run_steps is not None and self.total_steps < run_steps:
            rank_zero_warn(f"{self.name}(total_steps={self.total_steps}) is shorter than this run's {run_steps} "
                           f"optimizer steps: the learning rate will sit at its floor ({self.min_lr_ratio} × the base "
                           f"rate) for the last {run_steps - self.total_steps}. Leave total_steps out to follow the "
                           "Trainer's max_steps")

    def factor(self, step: int) -> float:
        warmup = self.warmup_steps if self.warmup_steps is not None else self._warmup_before_length()
        if step < warmup:
            return step / warmup
        if self.total_steps is None:
            if step > 0:
                raise ValueError(f"{self.name} stepped without a length: pass total_steps=..., or give it to "
                                 "RLModule(lr_scheduler=...), which sets the Trainer's max_steps")
            return 1.0
        progress = min(1.0, (step - warmup) / (self.total_steps - warmup))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * self.decay(progress)

    def _warmup_before_length(self) -> int:
        """Before the length is known only step 0 is evaluated: a warm-up ratio > 0 is then at least one step."""
        return 1 if self.warmup_arg > 0 else 0

    def decay(self, progress: float) -> float:
        raise NotImplementedError

    def _apply(self) -> None:
        """Set each group's learning rate to the current step's (after a change of length)."""
        step = max(self.last_epoch, 0)
        self._last_lr = [base * self.factor(step) for base in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def state_dict(self) -> dict:
        # LambdaLR would try to pickle the bound method; the position is plain numbers. The warm-up's
        # length goes along, under its own name, only so a resume can tell when it moved.
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas", *SETTINGS)}
        return {**state, "saved_warmup_steps": self.warmup_steps}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the position (step count, base rates); the settings stay this run's (an older
        checkpoint's settings are ignored), so the restored step gets this run's rate."""
        self.__dict__.update({k: v for k, v in state_dict.items() if k not in (*SETTINGS, "saved_warmup_steps")})
        if self.total_steps is not None:
            self._warn_warmup_moved(state_dict.get("saved_warmup_steps"))
            self._apply()

    def _warn_warmup_moved(self, saved: int | None) -> None:
        """A warm-up given as a fraction grows with a longer run: a step past the saved run's warm-up
        may fall inside this run's, and its learning rate drop back."""
        step = max(self.last_epoch, 0)
        if saved is not None and saved <= step < self.warmup_steps:
            rank_zero_warn(f"{self.name}: resumed at optimizer step {step}, past the checkpoint's warm-up ({saved} "
                           f"steps), but warmup_steps={self.warmup_arg} of this run's {self.total_steps} steps is "
                           f"{self.warmup_steps}: the learning rate drops back to {step}/{self.warmup_steps} of the base "
                           f"rate and warms up again. Give warmup_steps={saved} (an int) to keep the finished warm-up")


class WarmupCosineLR(_WarmupSchedule):
    """Linear warm-up, then a half cosine from the base learning rate down to a floor: the factor of
    ``transformers.get_cosine_with_min_lr_schedule_with_warmup``, ``½(1 + cos(π p))`` after the
    warm-up, except that ``p`` is capped at 1, so steps past ``total_steps`` stay at the floor
    instead of climbing back.

    `RLModule` steps its scheduler once per optimizer step (each mini-batch of each pass over a
    rollout), so ``total_steps`` counts optimizer steps: the Trainer's ``max_steps`` under
    manual optimization.

    Args:
        optimizer: the optimizer (`RLModule` passes it).
        total_steps: optimizer steps to the end of the decay (> the warm-up). None: set by
            `RLModule` to the run's optimizer steps (the Trainer's ``max_steps``), also on resume.
        warmup_steps: optimizer steps of linear warm-up (0: none), or a float in [0, 1): that
            fraction of ``total_steps``, rounded up (transformers' convention).
        min_lr_ratio: the floor, as a fraction of each group's base learning rate, in [0, 1].

    Examples:
        >>> import functools, torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = WarmupCosineLR(opt, total_steps=4, warmup_steps=2)
        >>> lrs = []
        >>> for _ in range(5):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 3)); opt.step(); sched.step()
        >>> lrs
        [0.0, 0.5, 1.0, 0.5, 0.0]
        >>> # for RLModule: lr_scheduler=functools.partial(WarmupCosineLR, warmup_steps=10)  (length: max_steps)
    """

    name = "WarmupCosineLR"

    def decay(self, progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupLinearLR(_WarmupSchedule):
    """Linear warm-up, then a linear decay from the base learning rate down to a floor: with the
    default floor 0, ``transformers.get_linear_schedule_with_warmup`` (TRL's default
    ``lr_scheduler_type="linear"``), whose factor after the warm-up is
    ``max(0, (total_steps - s) / (total_steps - warmup_steps))``, i.e. ``1 - p``.

    Args: those of `WarmupCosineLR` (``optimizer``, ``total_steps``, ``warmup_steps``, ``min_lr_ratio``).

    Examples:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = WarmupLinearLR(opt, total_steps=5, warmup_steps=1)
        >>> lrs = []
        >>> for _ in range(6):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 3)); opt.step(); sched.step()
        >>> lrs
        [0.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    """

    name = "WarmupLinearLR"

    def decay(self, progress: float) -> float:
        return 1.0 - progress
