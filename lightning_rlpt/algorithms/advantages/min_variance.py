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
``‖g_i‖²`` is not available before the backward pass: ``grad_sq_norms`` takes a proxy
(None: 1 for all; `ESSScaledLR` can pass the response length). With unit weights the baseline
is the group mean (Dr. GRPO's advantage).
"""
from __future__ import annotations

import torch

from .base import ADVANTAGE_ESTIMATORS


@ADVANTAGE_ESTIMATORS.register("min_variance_offpolicy")
def min_variance_offpolicy_advantage(rewards: torch.Tensor, *, is_weights: torch.Tensor | None = None,
                                     grad_sq_norms: torch.Tensor | None = None, eps: float = 1e-8,
                                     **_: object) -> torch.Tensor:
    """``A = R − Σ W R / (Σ W + eps)`` per group, ``W = grad_sq_norms · is_weights²`` (see the
    module docstring). ``is_weights`` / ``grad_sq_norms`` are ``[N]`` or group-shaped; None means 1.

    VCPO: "Variance-Controlled Policy Optimization" (mit-han-lab/vcpo), optimal off-policy baseline.
    """
    w = torch.ones_like(rewards) if is_weights is None else is_weights.to(rewards).reshape(rewards.shape)
    g = torch.ones_like(rewards) if grad_sq_norms is None else grad_sq_norms.to(rewards).reshape(rewards.shape)
    big_w = g * w ** 2
    baseline = (big_w * rewards).sum(1, keepdim=True) / (big_w.sum(1, keepdim=True) + eps)
    return rewards - baseline
