"""The advantage-estimator family: its registry and how the module calls it.

Every estimator has the signature ``fn(inputs, **options) -> advantages`` where ``inputs`` is an
`AdvantageInputs` record whose ``rewards`` is ``[num_groups, G]`` (row g holds the G completions
of prompt g); the result has the rewards' shape. Called with a bare ``[groups, G]`` rewards tensor
instead, an estimator sees a record of rewards only (the registry wraps each one). Traits,
declared at registration:

- ``group_relative``: compares completions of one prompt, so it needs ``G >= 2``;
- ``needs``: the record's fields it reads beyond ``rewards`` (``("is_weights", "lengths")``);
  the module fills exactly these and asks for the log-probs they take (`estimator_requests`);
- ``check``: ``fn(group_size, options)`` that refuses bad options before any work; ``options``
  holds every option, the signature's defaults filled in, so a check never repeats a default.

Options are the estimator's keyword parameters with defaults; ``advantage_kwargs`` naming any
other is refused at construction (`check_estimator`), not swallowed by ``**_``. One option is the
module's, never the user's (`MODULE_OPTIONS`): ``sum_over_ranks``, a function that sums a list
of floats over the data-parallel ranks, passed to the estimators that take it (batch
statistics over every rank's groups, e.g. ``grpo_batch_std``).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

from ...registry import Registry
from .inputs import FIELDS, AdvantageInputs, check_needs, experience_fields, field_requests


class EstimatorRegistry(Registry):
    """`Registry` whose ``register`` checks the ``needs`` trait and lets each estimator take a bare
    rewards tensor as well as the record (`AdvantageInputs` of rewards only)."""

    def register(self, name: str, **traits: Any) -> Callable[[Callable], Callable]:
        if "needs" in traits:
            traits["needs"] = check_needs(name, traits["needs"])
        add = super().register(name, **traits)

        def wrap(fn: Callable) -> Callable:
            clash = sorted(set(FIELDS) & set(inspect.signature(fn).parameters))
            if clash:
                raise TypeError(f"advantage estimator {name!r} has option(s) {clash} named like AdvantageInputs "
                                "fields: read them from the record (declare needs=...) and rename the option")

            @functools.wraps(fn)
            def estimator(inputs: AdvantageInputs | torch.Tensor, **options: Any) -> torch.Tensor:
                record = inputs if isinstance(inputs, AdvantageInputs) else AdvantageInputs(inputs)
                return fn(record, **options)

            return add(estimator)

        return wrap


ADVANTAGE_ESTIMATORS: EstimatorRegistry = EstimatorRegistry(
    "advantage estimator", traits={"group_relative": False, "needs": (), "check": None})

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


def estimator_requests(name: str) -> dict[str, bool]:
    """What the module must ask for (``module.request(**...)``) to fill ``name``'s ``needs``:
    ``{"old_logprobs": True, "rollout_logprobs": True}`` for importance weights, {} for rewards only."""
    return field_requests(ADVANTAGE_ESTIMATORS.trait(name, "needs"))


def estimator_fields(name: str, exp: Any, loss_mask: Callable[[Any], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The `AdvantageInputs` fields ``name`` needs, from the experience ``exp`` (flat, by name;
    {} for an estimator of rewards only, which then costs nothing).

    Args:
        loss_mask: ``module.loss_mask``: the tokens the loss trains on, which lengths and sums count.
    """
    needs = ADVANTAGE_ESTIMATORS.trait(name, "needs")
    return experience_fields(name, needs, exp, loss_mask(exp)) if needs else {}


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, sum_over_ranks: Any = None,
                       **options: object) -> torch.Tensor:
    """Flat ``[N]`` rewards → flat ``[N]`` advantages with the named estimator.

    Args:
        sum_over_ranks: sums a list of floats over the data-parallel ranks; given only to an
            estimator that takes it (None: this process is the batch).
        options: the estimator's own (``advantage_kwargs``) and `AdvantageInputs` fields by name,
            flat ``[N]`` (``rewards_per_func``: ``[N, F]``), which go into the record.
    """
    given = {k: options.pop(k) for k in FIELDS if k in options}
    record = AdvantageInputs.grouped(rewards, group_size, **given)
    if sum_over_ranks is not None and "sum_over_ranks" in (ADVANTAGE_ESTIMATORS.options(name) or {}):
        options = {**options, "sum_over_ranks": sum_over_ranks}
    return ADVANTAGE_ESTIMATORS.get(name)(record, **options).reshape(-1)
