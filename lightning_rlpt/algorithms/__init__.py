"""Pure tensor code: advantage estimators, policy losses, KL estimators, aggregation, mismatch
correction and the presets that select them. Nothing here knows about Lightning or models."""
from .advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from .aggregation import AGGREGATIONS, aggregate_loss
from .kl import KL_ESTIMATORS
from .losses import POLICY_LOSSES
from .presets import PRESETS, Objective, check_objective, resolve_objective

__all__ = ["ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "KL_ESTIMATORS", "Objective", "POLICY_LOSSES", "PRESETS",
           "aggregate_loss", "check_objective", "compute_advantages", "resolve_objective"]
