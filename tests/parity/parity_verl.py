"""verl 0.9.1's own ``verl.trainer.ppo.core_algos`` functions, called on given tensors.

verl is a test peer only: its ``__init__`` imports Ray, so the suite installs ``verl``, ``ray`` and
verl's light dependencies without theirs (Makefile). The functions are verl's registered ones,
looked up by name (``get_adv_estimator_fn``, ``get_policy_loss_fn``), with an ``ActorConfig``.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos",
                                 reason="verl's core_algos: pip install --no-deps verl==0.9.1 ray tensordict ...")
from verl.workers.config import ActorConfig  # noqa: E402


def outcome_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's token-level rewards for outcome scores: the score on each row's last trained token."""
    out = torch.zeros_like(mask)
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)
    out[last] = scores.to(out.dtype)[last.any(-1)]
    return out


def advantages(name: str, scores: torch.Tensor, mask: torch.Tensor, index, **options) -> torch.Tensor:
    """verl's estimator ``name`` on outcome ``scores``; ``index``: each row's prompt id."""
    fn = core_algos.get_adv_estimator_fn(name)
    adv, _ = fn(token_level_rewards=outcome_rewards(scores, mask), response_mask=mask, index=np.asarray(index),
                config=SimpleNamespace(gamma=1.0, get=lambda key, default=None: default), **options)
    return adv


def actor_config(**fields) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **fields)


def policy_loss(name: str, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                agg: str, **fields) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """verl's policy loss ``name`` aggregated by ``agg``: (loss, d loss / d logp, metrics)."""
    x = logp.clone().requires_grad_(True)
    loss, metrics = core_algos.get_policy_loss_fn(name)(old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask,
                                                       loss_agg_mode=agg, config=actor_config(**fields))
    loss.backward()
    return loss.detach(), x.grad, metrics


def kl(name: str, logp: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``kl_penalty`` per token: (values, d Σ values / d logp)."""
    x = logp.clone().requires_grad_(True)
    values = core_algos.kl_penalty(x, ref, name)
    values.sum().backward()
    return values.detach(), x.grad
