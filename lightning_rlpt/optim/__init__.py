"""Optimizers and learning-rate schedules, given to `RLModule` as callables (LightningCLI's
``OptimizerCallable`` / ``LRSchedulerCallable`` convention)."""
from .build import build_optimizer, build_scheduler, default_optimizer
from .schedules import WarmupCosineLR

__all__ = ["WarmupCosineLR", "build_optimizer", "build_scheduler", "default_optimizer"]
