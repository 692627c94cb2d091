"""`WarmupCosineLR`: linear warm-up, then a cosine decay to a floor (TRL's ``lr_scheduler_type=
"cosine_with_min_lr"`` with ``warmup_steps``), as a class so a YAML config can name it."""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


class WarmupCosineLR(LambdaLR):
    """Linear warm-up from 0 over ``warmup_steps`` optimizer steps, then a half cosine from the
    base learning rate down to ``min_lr_ratio`` × it at ``total_steps``, flat after that.

    The factor at optimizer step ``s`` (0-based: the factor the s-th step uses) is the one of
    ``transformers.get_cosine_with_min_lr_schedule_with_warmup``: ``s / warmup_steps`` during the
    warm-up (so the very first step, as in TRL, has learning rate 0), then
    ``min_lr_ratio + (1 - min_lr_ratio) · ½(1 + cos(π p))`` with
    ``p = (s - warmup_steps) / (total_steps - warmup_steps)``. Unlike that function, ``p`` is
    capped at 1, so steps past ``total_steps`` stay at the floor instead of climbing back.

    `RLModule` steps its scheduler once per optimizer step (each mini-batch of each pass over a
    rollout), so ``total_steps`` counts optimizer steps: the Trainer's ``max_steps`` under
    manual optimization.

    Args:
        optimizer: the optimizer (`RLModule` passes it).
        total_steps: optimizer steps to the end of the decay (> ``warmup_steps``).
        warmup_steps: optimizer steps of linear warm-up (0: none).
        min_lr_ratio: the floor, as a fraction of each group's base learning rate, in [0, 1].

    Example:
        >>> import functools, torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = WarmupCosineLR(opt, total_steps=4, warmup_steps=2)
        >>> lrs = []
        >>> for _ in range(5):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 3)); opt.step(); sched.step()
        >>> lrs
        [0.0, 0.5, 1.0, 0.5, 0.0]
        >>> # for RLModule: lr_scheduler=functools.partial(WarmupCosineLR, total_steps=200, warmup_steps=10)
    """

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0,
                 min_lr_ratio: float = 0.0, last_epoch: int = -1):
        if warmup_steps < 0 or total_steps <= warmup_steps:
            raise ValueError(f"WarmupCosineLR needs 0 <= warmup_steps < total_steps (got warmup_steps={warmup_steps}, "
                             f"total_steps={total_steps}); total_steps counts optimizer steps, the Trainer's max_steps")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1] (got {min_lr_ratio})")
        self.total_steps, self.warmup_steps, self.min_lr_ratio = total_steps, warmup_steps, min_lr_ratio
        super().__init__(optimizer, self.factor, last_epoch=last_epoch)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def state_dict(self) -> dict:
        # LambdaLR would try to pickle the bound method; the settings are plain numbers.
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)
