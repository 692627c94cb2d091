"""Data-parallel trainers and a shared resource (servers, a weight copy): one rank acts, every
rank learns the outcome.

Under DDP every trainer rank holds the same weights after an optimizer step, so an action on a
resource the ranks share (launching servers, sending the weights) is done by global rank 0
alone; every other rank waits for it in a ``broadcast_object_list`` that carries rank 0's result
*or its error*: the broadcast is the barrier ("the version is in place") and a failure on rank 0
stops every rank with the same message instead of leaving them blocked.

Examples:
    >>> urls = lead_then_share(lambda: [s.url for s in start_servers()], "launching the vLLM servers")  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist


def world() -> tuple[int, int]:
    """``(global rank, world size)``; ``(0, 1)`` without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def lead_then_share(action: Callable[[], Any], what: str) -> Any:
    """Run ``action`` on rank 0 only and return its (picklable) result on every rank.

    Args:
        action: what rank 0 does (launch servers, send weights).
        what: names the action in the error the other ranks raise when it failed on rank 0.
    """
    rank, size = world()
    if size == 1:
        return action()
    box: list[Any] = [None]
    failure: BaseException | None = None
    if rank == 0:
        try:
            box = [("ok", action())]
        except BaseException as err:  # noqa: BLE001 - shared first, re-raised below
            failure, box = err, [("failed", f"{type(err).__name__}: {err}")]
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if failure is not None:
        raise failure
    if status == "failed":
        raise RuntimeError(f"rank 0 failed {what}, so rank {rank} stops too: {value}")
    return value
