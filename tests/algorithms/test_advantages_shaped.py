"""REINFORCE++, QAE and Pass@k advantages against hand computations and brute-force enumeration."""
import itertools
import math

import pytest
import torch

from lightning_rlpt import ADVANTAGE_ESTIMATORS, compute_advantages
from lightning_rlpt.algorithms.advantages import check_estimator


def adv(name, rewards, **kw):
    return ADVANTAGE_ESTIMATORS.get(name)(torch.tensor(rewards, dtype=torch.float64), **kw)


def close(a, b):
    return torch.allclose(a, torch.tensor(b, dtype=torch.float64), atol=1e-6)


# ---------------------------------------------------------------- REINFORCE++
def test_reinforce_pp_normalises_over_the_batch():
    # rewards 1,0,0,0: mean 0.25, unbiased var (0.5625 + 3·0.0625)/3 = 0.25, std 0.5
    assert close(adv("reinforce_pp", [[1.0, 0.0], [0.0, 0.0]], eps=0.0), [[1.5, -0.5], [-0.5, -0.5]])


def test_reinforce_pp_group_baseline_then_batch_std():
    # group-centred: 0.5, -0.5, 0, 0; unbiased std sqrt(0.5/3)
    s = math.sqrt(0.5 / 3)
    assert close(adv("reinforce_pp", [[1.0, 0.0], [0.0, 0.0]], group_baseline=True, eps=0.0),
                 [[0.5 / s, -0.5 / s], [0.0, 0.0]])


def test_reinforce_pp_works_with_one_completion_per_prompt():
    check_estimator("reinforce_pp", 1)
    out = compute_advantages("reinforce_pp", torch.tensor([1.0, 0.0, 1.0, 0.0]), 1, eps=0.0)
    s = math.sqrt(1.0 / 3)  # mean 0.5, unbiased var 1/3
    assert torch.allclose(out, torch.tensor([0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s]), atol=1e-6)


# ---------------------------------------------------------------- QAE
def test_qae_binary_rewards_two_regime_gate():
    # K = 0.4, G = 4: hard prompt (p = 0.25 <= 0.6) baseline 0; easy prompt (p = 0.75) baseline 1
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]
    assert close(adv("qae", rewards, scale_by_std=False), [[1, 0, 0, 0], [0, 0, 0, -1]])
    assert close(adv("qae", rewards, eps=0.0), [[2, 0, 0, 0], [0, 0, 0, -2]])  # group std 0.5


def test_qae_boundary_p_equal_one_minus_k_is_hard():
    # G = 5, p = 0.6 = 1 - K: baseline 0 (0.6·5 in floating point is 3.0000000000000004)
    assert close(adv("qae", [[0.0, 0.0, 1.0, 1.0, 1.0]], scale_by_std=False), [[0, 0, 1, 1, 1]])
    assert close(adv("qae", [[0.0, 1.0, 1.0, 1.0, 1.0]], scale_by_std=False), [[-1, 0, 0, 0, 0]])


def test_qae_continuous_rewards_and_interpolation():
    # sorted 0.1 0.3 0.5 0.9; inverted CDF at 0.4: ceil(1.6) = 2nd value 0.3
    r = [[0.1, 0.5, 0.9, 0.3]]
    assert close(adv("qae", r, scale_by_std=False), [[-0.2, 0.2, 0.6, 0.0]])
    # linear: position 0.4·3 = 1.2 -> 0.3 + 0.2·(0.5 - 0.3) = 0.34
    assert close(adv("qae", r, scale_by_std=False, method="linear"), [[-0.24, 0.16, 0.56, -0.04]])


@pytest.mark.parametrize("k", [0.0, 1.0, -0.1, 1.5])
def test_qae_quantile_outside_open_unit_interval(k):
    with pytest.raises(ValueError, match="between 0 and 1"):
        adv("qae", [[0.0, 1.0]], quantile=k)


# ---------------------------------------------------------------- Pass@k
def passk_brute_force(rewards, k):
    """Every k-subset scored by its max; normalised by the subsets' mean and population std;
    each response's advantage is the mean over the subsets that contain it."""
    n = len(rewards)
    subsets = list(itertools.combinations(range(n), k))
    scores = [max(rewards[i] for i in s) for s in subsets]
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((x - mean) ** 2 for x in scores) / len(scores))
    if std == 0:
        return [0.0] * n
    return [sum((x - mean) / std for s, x in zip(subsets, scores) if i in s) / sum(i in s for s in subsets)
            for i in range(n)]


def test_passk_hand_value():
    # G = 4, c = 1, k = 2: R̄ = 1 - C(3,2)/C(4,2) = 0.5, σ = 0.5; A+ = 1, A- = (1 - 2/3 - 0.5)/0.5 = -1/3
    assert close(adv("passk", [[1.0, 0.0, 0.0, 0.0]], k=2), [[1.0, -1 / 3, -1 / 3, -1 / 3]])


@pytest.mark.parametrize("n,k", [(4, 2), (6, 3), (8, 4), (5, 1), (5, 5)])
def test_passk_matches_enumeration_of_all_subsets(n, k):
    for c in range(n + 1):
        rewards = [1.0] * c + [0.0] * (n - c)
        got = adv("passk", [rewards], k=k)[0]
        assert torch.allclose(got, torch.tensor(passk_brute_force(rewards, k), dtype=torch.float64), atol=1e-9), (n, k, c)


def test_passk_k1_is_grpo_with_population_std():
    r = [[1.0, 0.0, 0.0, 1.0, 1.0, 0.0]]
    assert torch.allclose(adv("passk", r, k=1), adv("grpo", r, std_unbiased=False, eps=0.0), atol=1e-9)


def test_passk_zero_when_every_subset_passes():
    assert close(adv("passk", [[1.0, 1.0, 1.0, 0.0]], k=2), [[0, 0, 0, 0]])  # G - c = 1 < k


def test_passk_rejects_k_above_group_size_and_non_binary_rewards():
    with pytest.raises(ValueError, match="k <= group size"):
        adv("passk", [[1.0, 0.0]], k=3)
    with pytest.raises(ValueError, match="binary"):
        adv("passk", [[0.5, 0.0, 1.0, 0.0]], k=2)
    # with a threshold, 0.5 < 1 is a failure
    assert close(adv("passk", [[0.5, 0.0, 1.0, 0.0]], k=2, success_threshold=1.0),
                 adv("passk", [[0.0, 0.0, 1.0, 0.0]], k=2).tolist())


@pytest.mark.parametrize("name", ["qae", "passk"])
def test_group_estimators_refuse_group_size_one(name):
    with pytest.raises(ValueError, match="group_size >= 2"):
        check_estimator(name, 1)
