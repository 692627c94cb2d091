"""PPO clip with separate ranges and dual clip: each case by hand, values and gradients."""
import math

import pytest
import torch

from lightning_rlpt.algorithms.losses.ppo import ppo_clip_loss


def _loss(ratio, adv, **kw):
    old = torch.zeros(1, 1)
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.sum().backward()
    return loss.item(), logp.grad.item(), {k: v.item() for k, v in stats.items()}


def test_inside_the_range_is_plain_ratio_times_advantage():
    value, grad, stats = _loss(1.1, 2.0, clip_low=0.2, clip_high=0.28)
    assert value == pytest.approx(-2.2)
    assert grad == pytest.approx(-2.2)  # d(-A r)/dlogp = -A r
    assert stats["clip_ratio/region"] == 0


def test_clip_higher_caps_positive_advantage():
    value, grad, stats = _loss(1.5, 1.0, clip_low=0.2, clip_high=0.28)
    assert value == pytest.approx(-1.28)
    assert grad == 0.0
    assert stats["clip_ratio/high"] == 1 and stats["clip_ratio/low"] == 0


def test_clip_low_caps_negative_advantage_below_range():
    value, grad, stats = _loss(0.5, -1.0, clip_low=0.2, clip_high=0.28)
    assert value == pytest.approx(0.8)
    assert grad == 0.0
    assert stats["clip_ratio/low"] == 1


def test_negative_advantage_above_range_is_not_clipped_without_dual_clip():
    value, grad, _ = _loss(20.0, -1.0, clip_low=0.2, clip_high=0.2)
    assert value == pytest.approx(20.0)
    assert grad == pytest.approx(20.0)


def test_dual_clip_caps_negative_advantage_at_c():
    value, grad, stats = _loss(20.0, -1.0, clip_low=0.2, clip_high=0.2, dual_clip=10.0)
    assert value == pytest.approx(10.0)
    assert grad == 0.0
    assert stats["clip_ratio/dual"] == 1


def test_dual_clip_leaves_positive_advantages_alone():
    value, _, stats = _loss(20.0, 1.0, clip_low=0.2, clip_high=0.2, dual_clip=10.0)
    assert value == pytest.approx(-1.2)
    assert stats["clip_ratio/dual"] == 0


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        _loss(1.0, 1.0, dual_clip=0.5)


def test_token_level_advantages_and_mask_shape():
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 1.0]])
    loss, _ = ppo_clip_loss(logp, torch.zeros(2, 3), adv, torch.ones(2, 3))
    assert loss.tolist() == [[-1.0, -2.0, -3.0], [0.0, 1.0, -1.0]]
