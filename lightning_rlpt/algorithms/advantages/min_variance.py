"""VCPO's minimum-variance baseline for off-policy (importance-weighted) policy gradients.

Derivation (done here, not taken from the authors' code). For one group of G completions
``y_i`` sampled from the behaviour policy, with sequence importance weight ``w_i`` (current
over behaviour), reward ``R_i`` and score ``g_i = ∇logπ(y_i)``, the importance-weighted
estimator with a constant baseline is ``ĝ(b) = Σ_i w_i (R_i − b) g_i``. Its baseline-dependent
second moment, neglecting the cross terms between independent samples as the classic optimal
baseline derivation does, is ``Σ_i w_i² (R_i − b)² ‖g_i‖²``. Setting its derivative in b to 0,
``Σ_i W_i (R_i − b) = 0`` with ``W_i = ‖g_i‖²·w_i²``, gives

    ``b = Σ_i W_i R_i / (Σ_i W_i + eps)``   and the advantage   ``A_i = R_i − b``.

The importance weight ``w_i`` must then multiply the loss exactly once (the module's
``rollout_correction``, e.g. ``seq_tis``); it enters ``W_i`` squared only because the baseline
minimises a second moment. Scaling the advantage by ``w_i`` as well would apply it twice.
``‖g_i‖²`` is not available before the backward pass: ``grad_norm_proxy`` picks a proxy (``none``:
1 for all; ``length``: the trained tokens of the completion). With unit weights the baseline is
the group mean (Dr. GRPO's advantage).

Selected with ``RLModule(advantage="min_variance_offpolicy")``: the estimator's ``needs``
(``is_weights``, ``lengths``, ``trained``) make the module ask the engine for behaviour
log-probs and recompute π_old before the advantages, so ``w_i = π_old(y_i)/π_behaviour(y_i)``
over the tokens the loss trains on. A row the loss does not train on (a truncated row under
``mask_truncated_completions``) has no gradient: ``W_i = 0`` keeps it out of the baseline.
"""
from __future__ import annotations

import torch

from .base import ADVANTAGE_ESTIMATORS
from .inputs import AdvantageInputs

GRAD_NORM_PROXIES = ("none", "length")


def _check(group_size: int, options: dict) -> None:
    if options["grad_norm_proxy"] not in GRAD_NORM_PROXIES:
        raise ValueError(f"min_variance_offpolicy: grad_norm_proxy must be one of {GRAD_NORM_PROXIES} "
                         f"(got {options['grad_norm_proxy']!r}); advantage_kwargs={{'grad_norm_proxy': 'length'}} "
                         "uses the trained tokens per completion as ‖∇logπ‖²")


@ADVANTAGE_ESTIMATORS.register("min_variance_offpolicy", needs=("is_weights", "lengths", "trained"), check=_check)
def min_variance_offpolicy_advantage(inputs: AdvantageInputs, *, grad_norm_proxy: str = "none",
                                     grad_sq_norms: torch.Tensor | None = None, eps: float = 1e-8,
                                     **_: object) -> torch.Tensor:
    """``A = R − Σ W R / (Σ W + eps)`` per group, ``W = ‖g‖² · w² · trained`` (see the module
    docstring). Fields left None (a direct call) count as 1 / every row trained.

    VCPO: "Variance-Controlled Policy Optimization" (mit-han-lab/vcpo), optimal off-policy baseline.

    Args:
        grad_norm_proxy: ``none`` (‖g_i‖² = 1) or ``length`` (``inputs.lengths``).
        grad_sq_norms: explicit ``[N]`` or group-shaped ‖g_i‖² values, over the proxy (direct calls).
        eps: added to Σ W.
    """
    rewards = inputs.rewards
    w = _or_ones(inputs.is_weights, rewards)
    if grad_sq_norms is not None:
        g = _or_ones(grad_sq_norms, rewards)
    else:
        g = _or_ones(inputs.lengths if grad_norm_proxy == "length" else None, rewards)
    big_w = g * w ** 2 * _or_ones(inputs.trained, rewards)
    baseline = (big_w * rewards).sum(1, keepdim=True) / (big_w.sum(1, keepdim=True) + eps)
    return rewards - baseline


def _or_ones(values: torch.Tensor | None, rewards: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(rewards) if values is None else values.to(rewards).reshape(rewards.shape)
