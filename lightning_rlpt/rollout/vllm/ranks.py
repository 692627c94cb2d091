"""Data-parallel trainers (DDP) and vLLM servers: one rank acts, every rank learns the outcome.

Under DDP every trainer rank holds the same weights after an optimizer step, so sending them
from each rank would move the same bytes ``world_size`` times and race on the servers' weight
version. The rule here:

- **global rank 0 alone** launches the servers (``launch=``; the others connect to the URLs it
  broadcasts) and sends weights (``/update_weight_version`` ``updating-<v>``, the transport,
  ``<v>``);
- every other rank waits for it in a ``broadcast_object_list`` that carries rank 0's result
  *or its error*: the broadcast is the barrier ("the version is in place") and a failure on
  rank 0 stops every rank with the same message instead of leaving them blocked;
- then each rank samples **its own rows** from the shared servers (its requests, its seeds) and
  checks ``/weight_info`` itself before each rollout.

Sharded strategies (FSDP/FSDP2) would need every rank to take part in gathering the weights;
they are refused with more than one process (`check_strategy`).

`lead_then_share` and `world`, which any engine can use, are the rollout layer's (`rollout.ranks`).
"""
from __future__ import annotations

from typing import Any


def check_strategy(strategy: Any, world_size: int) -> None:
    """Refuse more than one trainer process unless every rank holds the full weights (DDP)."""
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    if world_size > 1 and (not isinstance(strategy, DDPStrategy) or isinstance(strategy, DeepSpeedStrategy)):
        raise ValueError(
            f"VLLMServerRollout runs with {world_size} trainer processes only under DDP (every rank holds the "
            f"full weights, rank 0 sends them); {type(strategy).__name__} shards them, and gathering them for the "
            "servers is not built. Use strategy='ddp', or one trainer process (devices=1)")
