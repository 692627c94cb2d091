"""Advantage estimators against values computed by hand."""
import math

import pytest
import torch

from lightning_rlpt.algorithms.advantages import check_estimator, compute_advantages


def test_grpo_mean_std_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = compute_advantages("grpo", r, group_size=4)
    # group 1: mean 0.5, unbiased std sqrt(1/3); group 2: all equal -> 0
    s = math.sqrt(1 / 3)
    expected = [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6), 0, 0, 0, 0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_grpo_population_std_option():
    r = torch.tensor([2.0, 0.0])
    adv = compute_advantages("grpo", r, group_size=2, std_unbiased=False, eps=0.0)
    assert adv.tolist() == pytest.approx([1.0, -1.0])  # mean 1, population std 1


def test_dr_grpo_mean_only():
    r = torch.tensor([3.0, 1.0, 2.0, 0.0, 0.0, 6.0])
    adv = compute_advantages("dr_grpo", r, group_size=3)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, -2.0, -2.0, 4.0])


def test_rloo_leave_one_out():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0])
    adv = compute_advantages("rloo", r, group_size=4)
    # baseline of sample i = mean of the other three
    assert adv.tolist() == pytest.approx([1 - 2 / 3, 0 - 1, 0 - 1, 2 - 1 / 3])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_size_one_is_refused(name):
    with pytest.raises(ValueError, match="group_size >= 2"):
        check_estimator(name, 1)


def test_unknown_estimator_lists_known():
    with pytest.raises(ValueError, match="known: .*dr_grpo.*grpo.*rloo"):
        compute_advantages("nope", torch.zeros(4), group_size=2)
