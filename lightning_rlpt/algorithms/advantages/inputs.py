"""`AdvantageInputs`: the one record an advantage estimator receives, and how the module fills it.

An estimator declares the fields it reads beyond ``rewards`` (its ``needs`` trait); the module
computes only those (`experience_fields`) and asks for the log-probs they take (`field_requests`:
behaviour log-probs from the engine, π_old recomputed before the advantages), so an estimator
that reads nothing but rewards costs nothing extra. Every tensor is group-shaped ``[groups, G]``
(``rewards_per_func``: ``[groups, G, F]``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

from ..correction import sequence_weights

if TYPE_CHECKING:  # only for the annotation: the algorithms stay free of the record's module
    from ...experience import Experience


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read. ``rewards`` is always there; every other field is None unless
    the estimator's ``needs`` names it (or a direct caller of `compute_advantages` passes it).

    Attributes:
        rewards: ``[groups, G]`` the rewards (scores plus any callback's edits).
        rewards_per_func: ``[groups, G, F]`` each reward function's raw score (NaN: "does not apply").
        lengths: ``[groups, G]`` tokens the loss trains on per completion (``module.loss_mask``).
        trained: ``[groups, G]`` bool, the completion has at least one trained token.
        behaviour_logprob_sums: ``[groups, G]`` Σ over trained tokens of the engine's log-probs.
        old_logprob_sums: ``[groups, G]`` Σ over trained tokens of π_old's (the learner's) log-probs.
        is_weights: ``[groups, G]`` sequence importance weights π_old/π_behaviour over the trained
            tokens, ``exp(old − behaviour)`` with the log clamped to ±20 (1 for an untrained row).
    """

    rewards: torch.Tensor
    rewards_per_func: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    trained: torch.Tensor | None = None
    behaviour_logprob_sums: torch.Tensor | None = None
    old_logprob_sums: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None

    @classmethod
    def grouped(cls, rewards: torch.Tensor, group_size: int, **given: torch.Tensor | None) -> "AdvantageInputs":
        """The record of flat ``[N]`` (or ``[N, F]``) tensors, each viewed as ``[N // G, G, ...]``.

        Args:
            rewards: ``[N]`` (or already ``[groups, G]``).
            group_size: G.
            given: other fields by name, flat or grouped.
        """
        unknown = sorted(set(given) - set(FIELDS))
        if unknown:
            raise TypeError(f"AdvantageInputs has no field(s) {unknown}; its fields: {', '.join(FIELDS)}")
        shaped = {k: None if v is None else _grouped(k, torch.as_tensor(v), group_size) for k, v in given.items()}
        return cls(rewards.reshape(-1, group_size), **shaped)


def _grouped(field: str, value: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N]`` → ``[groups, G]``; ``rewards_per_func`` ``[N, F]`` → ``[groups, G, F]``."""
    if field == "rewards_per_func":
        return value.reshape(-1, group_size, value.shape[-1])
    return value.reshape(-1, group_size)


# Fields beyond rewards, in declaration order: what a ``needs`` trait may name.
FIELDS = tuple(f.name for f in fields(AdvantageInputs) if f.name != "rewards")

# The module's requests (`knobs.Requests`) a field takes: log-probs it would not compute otherwise.
_REQUESTS = {"behaviour_logprob_sums": ("rollout_logprobs",), "old_logprob_sums": ("old_logprobs",),
             "is_weights": ("old_logprobs", "rollout_logprobs")}


def check_needs(name: str, needs: Any) -> tuple[str, ...]:
    """``needs`` as a tuple of known field names, or a TypeError naming the unknown one."""
    needs = (needs,) if isinstance(needs, str) else tuple(needs)
    unknown = sorted(set(needs) - set(FIELDS))
    if unknown:
        raise TypeError(f"advantage estimator {name!r} needs unknown field(s) {unknown}; AdvantageInputs "
                        f"has {', '.join(FIELDS)} (rewards always)")
    return needs


def field_requests(needs: tuple[str, ...]) -> dict[str, bool]:
    """The module requests (``module.request(**...)``) that filling ``needs`` takes."""
    return {flag: True for field in needs for flag in _REQUESTS.get(field, ())}


def experience_fields(name: str, needs: tuple[str, ...], exp: "Experience",
                      mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ``needs`` fields of ``exp``, flat ``[N]`` (``rewards_per_func``: ``[N, F]``).

    Args:
        name: the estimator, for messages.
        needs: its ``needs`` trait.
        exp: the experience, log-probs filled (`MakeExperience._fill_logprobs`).
        mask: ``[N, C]`` float, the tokens the loss trains on (``module.loss_mask(exp)``).
    """
    out: dict[str, torch.Tensor] = {}
    mask = mask.double()
    for field in needs:
        if field == "rewards_per_func":
            out[field] = exp.rewards_per_func
        elif field == "lengths":
            out[field] = mask.sum(-1).to(exp.rewards.dtype)
        elif field == "trained":
            out[field] = mask.sum(-1) > 0
        elif field == "behaviour_logprob_sums":
            out[field] = _sums(_logprobs(name, exp, "behaviour_logprobs"), mask).to(exp.rewards.dtype)
        elif field == "old_logprob_sums":
            out[field] = _sums(_logprobs(name, exp, "old_logprobs"), mask).to(exp.rewards.dtype)
        elif field == "is_weights":
            old, behaviour = _logprobs(name, exp, "old_logprobs"), _logprobs(name, exp, "behaviour_logprobs")
            out[field] = sequence_weights(old, behaviour, mask.to(old.device)).to(exp.rewards.dtype)
    return out


def _sums(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (logprobs.detach().double() * mask.to(logprobs.device)).sum(-1)


def _logprobs(name: str, exp: "Experience", attribute: str) -> torch.Tensor:
    """``exp.<attribute>``, or an error saying which estimator needs it and how to get it."""
    value = getattr(exp, attribute)
    if value is not None:
        return value
    if attribute == "behaviour_logprobs":
        raise ValueError(f"advantage estimator {name!r} needs the rollout engine's log-probs (importance weights), "
                         "and this engine reported none: build it with return_logprobs=True, leave the module's "
                         "own engine (it is asked for them), or roll out with VLLMRollout")
    raise RuntimeError(f"advantage estimator {name!r} needs π_old's log-probs, which the module was asked for "
                       "but did not compute; please report this")
