"""Optimizers and learning-rate schedules, given to `RLModule` as callables (LightningCLI's
``OptimizerCallable`` / ``LRSchedulerCallable`` convention)."""
from .build import (build_optimizer, build_scheduler, check_update_numbers, default_optimizer, for_precision,
                    optimizer_factory, run_steps)
from .schedules import WarmupCosineLR, WarmupLinearLR

__all__ = ["WarmupCosineLR", "WarmupLinearLR", "build_optimizer", "build_scheduler", "check_update_numbers",
           "default_optimizer", "for_precision", "optimizer_factory", "run_steps"]
