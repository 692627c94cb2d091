"""Moved to `lightning_rlpt.rollout.server_pool` (any engine over HTTP completion servers uses it);
kept so imports from here keep working."""
from ..server_pool import BadRequest, ServerFailure, ServerPool

__all__ = ["BadRequest", "ServerFailure", "ServerPool"]
