"""MinPRO's prefix and CTPO's position t count the row's *model* tokens only (mask 1): a
tool's or environment's tokens (mask 0) are neither in a prefix nor a step of the walk, and a
row that opens with masked tokens (a ``rollout_func`` episode whose first token is not the
model's) starts with the empty prefix (weight 1) and position 1. Numbers computed by hand on a
mask with a leading 0 and an interior 0."""
import math

import pytest
from test_losses_zoo_and_presets import run  # loss, d(Σ mask·loss)/d logπ and stats for log-ratios (old = 0)

MASK = [[0, 1, 1, 0, 1]]  # a leading and an interior non-model token


def test_minpro_prefix_is_over_earlier_model_tokens_only():
    # The masked tokens' ratios (e^3, e^-5) would be the prefix's maximum / minimum if they counted.
    delta = [[3.0, 0.1, -0.15, -5.0, 0.05]]
    loss, grad, stats = run("minpro", delta, [1.0], MASK)
    # w at token 1: no model token before it, the empty prefix (was e^20); token 2: min{0.1};
    # token 4: min{0.1, -0.15} (token 3's -5.0 is a tool's). Masked tokens: neutral 1.
    weights = [1.0, 1.0, math.exp(0.1), 1.0, math.exp(-0.15)]
    assert stats["minpro/prefix_weight"][0].tolist() == pytest.approx(weights, rel=1e-12)
    # All ratios inside [0.8, 1.2]: loss_t = -A·w_t·r_t and its gradient is the same.
    want = [-math.exp(0.1), -math.exp(0.1) * math.exp(-0.15), -math.exp(-0.15) * math.exp(0.05)]
    assert [loss[0, t].item() for t in (1, 2, 4)] == pytest.approx(want, rel=1e-12)
    assert [grad[0, t].item() for t in (1, 2, 4)] == pytest.approx(want, rel=1e-12)


def test_minpro_row_opening_with_masked_tokens_equals_the_row_without_them():
    """The same model tokens, with and without a leading tool turn: the same loss (the issue's
    −1.8e7 for a loss that ppo_clip puts at −0.128)."""
    with_tool, _, _ = run("minpro", [[0.0, 0.0, -0.128, 0.1]], [1.0], [[0, 0, 1, 1]])
    alone, _, _ = run("minpro", [[-0.128, 0.1]], [1.0], [[1, 1]])
    assert with_tool[0, 2:].tolist() == pytest.approx(alone[0].tolist(), rel=1e-12)
    assert abs(with_tool[0, 3].item()) < 2


def test_ctpo_position_counts_model_tokens_only():
    """Model tokens at columns 1, 2, 4 have t = 1, 2, 3 (not 2, 3, 5): the log-space bounds are
    ε·√t of those, and the cumulative log-ratio skips the masked columns (their 2.0 and 5.0)."""
    delta = [[2.0, 0.06, 0.0, 5.0, 0.03], [0.0, -0.03, 0.0, 0.0, 0.0]]
    loss, grad, stats = run("ctpo", delta, [1.0, -1.0], [MASK[0], MASK[0]])
    hi = [0.05 * math.sqrt(t) for t in (1, 2, 3)]
    # Row 0 (A = 1), cumulative 0.06, 0.06, 0.09: t=1 clipped high (0.06 > 0.05; 0.0707 at t=2),
    # t=2 inside (0.06 < 0.0707), t=3 clipped high (0.09 > 0.0866; 0.1118 at t=5).
    assert [loss[0, t].item() for t in (1, 2, 4)] == pytest.approx([-math.exp(hi[0]), -math.exp(0.06),
                                                                    -math.exp(hi[2])], rel=1e-12)
    assert [grad[0, t].item() for t in (1, 2, 4)] == pytest.approx([0.0, -math.exp(0.06), 0.0], abs=1e-12)
    assert stats["clip_ratio/high"][0].tolist() == [0, 1, 0, 0, 1]
    # Row 1 (A = -1): -0.03 < -0.025·√1 clipped low at t=1 (inside -0.0354 at t=2): loss e^-0.025, no gradient.
    assert loss[1, 1].item() == pytest.approx(math.exp(-0.025), rel=1e-12) and grad[1, 1].item() == 0.0
    assert stats["clip_ratio/low"][1].tolist() == [0, 1, 0, 0, 0]
