"""Optimizers and learning-rate schedules, given to `RLModule` as callables (LightningCLI's
``OptimizerCallable`` / ``LRSchedulerCallable`` convention)."""
from .build import build_optimizer, build_scheduler, check_update_numbers, default_optimizer, optimizer_factory
from .schedules import WarmupCosineLR

__all__ = ["WarmupCosineLR", "build_optimizer", "build_scheduler", "check_update_numbers", "default_optimizer", "optimizer_factory"]
