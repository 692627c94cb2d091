"""Moved to `lightning_rlpt.rollout.pipeline` (any engine that can run ahead uses it); kept so
imports from here keep working."""
from ..pipeline import MISMATCH, Lookahead, Pending, RolloutPipeline, keyed_seed

__all__ = ["MISMATCH", "Lookahead", "Pending", "RolloutPipeline", "keyed_seed"]
