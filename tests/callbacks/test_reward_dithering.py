"""RewardDithering (ReDit): the callback against values computed by hand from its formula (cited in its
docstring and docs/callbacks.md), on its pure controller and inside a tiny fit."""
import math

import pytest
import torch

from callback_helpers import Spy, fit, make_module
from lightning_rlpt.callbacks import RewardDithering
from lightning_rlpt.seeding import keyed_generator


@pytest.mark.parametrize("distribution", ["gaussian", "uniform"])
def test_dithering_noise_is_the_seeded_draw_with_the_right_statistics(distribution, warm_start_dir, arithmetic_rows):
    big = RewardDithering(scale=0.05, distribution=distribution, seed=3).noise(200_000, 0.05)
    expected_std = 0.05 if distribution == "gaussian" else 0.05 / math.sqrt(3)
    assert abs(big.mean().item()) < 1e-3 and big.std().item() == pytest.approx(expected_std, rel=0.02)
    if distribution == "uniform":
        assert big.abs().max().item() <= 0.05
    raw, noisy = [], []
    dither = RewardDithering(scale=0.1, distribution=distribution, decay="linear", decay_steps=2, seed=11)
    spy_before = Spy(lambda h, t, m, e: h == "rewards" and raw.append(e.rewards.clone()))
    spy_after = Spy(lambda h, t, m, e: h == "rewards" and noisy.append(e.rewards.clone()))
    fit(make_module(warm_start_dir), [spy_before, dither, spy_after], arithmetic_rows[:8], steps=2)
    assert len(raw) == len(noisy) == 2  # the hook fired once per step on both sides of the dithering
    for t, (a, b) in enumerate(zip(raw, noisy)):
        scale = 0.1 * (1 - t / 2)
        g = keyed_generator("dithering", 11, t, 0)  # keyed by (seed, rollout, rank)
        draw = torch.randn(16, generator=g) if distribution == "gaussian" else torch.rand(16, generator=g) * 2 - 1
        assert torch.allclose(b - a, draw * scale, atol=1e-7)
