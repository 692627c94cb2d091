"""AccuracyConditionedKL (FG-ExPO AKL): the callback against values computed by hand from its formula
(cited in its docstring and docs/callbacks.md), on its pure controller and inside a tiny fit."""
import math

import pytest

from callback_helpers import Spy, fit, make_module
from lightning_rlpt.callbacks import AccuracyConditionedKL


def test_akl_coefficient_matches_the_logistic_and_reaches_the_loss(warm_start_dir, arithmetic_rows):
    akl = AccuracyConditionedKL(kl_min=0.01, kl_max=0.2, midpoint=0.4, steepness=8.0, smoothing=0.5)
    hand = lambda a: 0.01 + 0.19 / (1 + math.exp(-8.0 * (a - 0.4)))
    assert akl.observe(0.0) == pytest.approx(hand(0.0))
    assert akl.observe(1.0) == pytest.approx(hand(0.5))  # smoothed: 0.5·0 + 0.5·1
    assert [akl.coefficient(a) for a in (0.2, 0.4, 0.9)] == pytest.approx([hand(0.2), hand(0.4), hand(0.9)])
    assert akl.coefficient(0.2) < akl.coefficient(0.4) < akl.coefficient(0.9)
    seen = []

    def check(hook, trainer, module, exp):
        if hook == "rewards":
            seen.append(("acc", float((exp.rewards >= 1.0).float().mean())))
        if hook == "loss":
            seen.append(("coef", module.knobs.kl_coef))

    fresh = AccuracyConditionedKL(kl_min=0.01, kl_max=0.2)
    fit(make_module(warm_start_dir), [fresh, Spy(check)], arithmetic_rows[:8], steps=2)
    assert [hook for hook, _ in seen] == ["acc", "coef"] * 2  # both hooks fired, once per step, in order
    for (_, acc), (_, coef) in zip(seen[::2], seen[1::2]):
        assert coef == pytest.approx(0.01 + 0.19 / (1 + math.exp(-10 * (acc - 0.5))))
