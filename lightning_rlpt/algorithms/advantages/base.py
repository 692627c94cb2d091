"""The advantage-estimator family: its registry and how the module calls it.

Every estimator has the signature ``fn(rewards, **options) -> advantages`` where ``rewards`` is
``[num_groups, G]`` (row g holds the G completions of prompt g) and the result has the same
shape. Traits, declared at registration:

- ``group_relative``: compares completions of one prompt, so it needs ``G >= 2``;
- ``check``: ``fn(group_size, options)`` that refuses bad options before any work; ``options``
  holds every option, the signature's defaults filled in, so a check never repeats a default.

Options are the estimator's keyword parameters with defaults; ``advantage_kwargs`` naming any
other is refused at construction (`check_estimator`), not swallowed by ``**_``. One option is the
module's, never the user's (`MODULE_OPTIONS`): ``sum_over_ranks``, a function that sums a list
of floats over the data-parallel ranks, passed to the estimators that take it (batch
statistics over every rank's groups, e.g. ``grpo_batch_std``).
"""
from __future__ import annotations

from typing import Any

import torch

from ...registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", traits={"group_relative": False, "check": None})

# What `compute_advantages` passes, from the module, to an estimator whose signature names it.
MODULE_OPTIONS = ("sum_over_ranks",)


def check_estimator(name: str, group_size: int, options: dict[str, Any] | None = None) -> None:
    """Fail early on an estimator that cannot run with this group size or these options (an
    option it does not take included)."""
    options = ADVANTAGE_ESTIMATORS.check_options(name, options, "advantage_kwargs", supplied=MODULE_OPTIONS)
    if ADVANTAGE_ESTIMATORS.trait(name, "group_relative") and group_size < 2:
        raise ValueError(
            f"advantage estimator {name!r} compares completions within a group, so it needs "
            f"group_size >= 2 (got {group_size}); set group_size=8 (a common choice) or more"
        )
    check = ADVANTAGE_ESTIMATORS.trait(name, "check")
    if check is not None:
        check(group_size, options)


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, sum_over_ranks: Any = None,
                       **options: object) -> torch.Tensor:
    """Flat ``[N]`` rewards → flat ``[N]`` advantages with the named estimator.

    Args:
        sum_over_ranks: sums a list of floats over the data-parallel ranks; given only to an
            estimator that takes it (None: this process is the batch).
        options: the estimator's own (``advantage_kwargs``).
    """
    grouped = rewards.view(-1, group_size)
    if sum_over_ranks is not None and "sum_over_ranks" in (ADVANTAGE_ESTIMATORS.options(name) or {}):
        options = {**options, "sum_over_ranks": sum_over_ranks}
    return ADVANTAGE_ESTIMATORS.get(name)(grouped, **options).reshape(-1)
