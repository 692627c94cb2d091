"""More advantage estimators: REINFORCE++ (batch-normalised), QAE (quantile baseline) and the
analytic Pass@k advantage. Signature in `base`: ``fn(inputs) -> [groups, G]``, rewards only.
"""
from __future__ import annotations

import math

import torch

from .base import ADVANTAGE_ESTIMATORS
from .inputs import AdvantageInputs

PASSK_DEFAULT_K = 4
QUANTILE_METHODS = ("inverted_cdf", "linear", "lower", "higher", "midpoint", "nearest")


def _check_reinforce_pp(group_size: int, options: dict) -> None:
    if options["group_baseline"] and group_size < 2:
        raise ValueError("reinforce_pp with group_baseline=True subtracts a group mean, so it needs "
                         f"group_size >= 2 (got {group_size}); drop group_baseline for G = 1")


@ADVANTAGE_ESTIMATORS.register("reinforce_pp", check=_check_reinforce_pp)
def reinforce_pp_advantage(inputs: AdvantageInputs, *, group_baseline: bool = False, eps: float = 1e-6,
                           std_unbiased: bool = True, **_: object) -> torch.Tensor:
    """REINFORCE++: ``A = (r - mean_B) / (std_B + eps)`` over the whole batch B.

    Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    arXiv 2501.03262. Batch (not group) normalisation needs no group, so G = 1 works.
    ``group_baseline=True`` first subtracts each group's mean ("REINFORCE++-baseline"), then
    normalises by the batch statistics. The batch is this rank's rollout: an estimator is a
    pure function, so with several data-parallel ranks each normalises its own share.
    """
    rewards = inputs.rewards
    adv = rewards - rewards.mean(dim=1, keepdim=True) if group_baseline else rewards
    flat = adv.reshape(-1)
    if flat.numel() < 2:
        return torch.zeros_like(adv)
    return (adv - flat.mean()) / (flat.std(unbiased=std_unbiased) + eps)


def check_quantile(quantile: float) -> None:
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"qae quantile K must lie strictly between 0 and 1 (got {quantile}); the paper uses K = 0.4")


def group_quantile(rewards: torch.Tensor, quantile: float, method: str) -> torch.Tensor:
    """``[groups, 1]`` K-quantile of each row. ``inverted_cdf``: the smallest reward r with
    ``F(r) ≥ K`` (sorted index ``ceil(K·G) - 1``), always one of the observed rewards."""
    if method not in QUANTILE_METHODS:
        raise ValueError(f"unknown quantile method {method!r}; known: {', '.join(QUANTILE_METHODS)}")
    if method != "inverted_cdf":
        return torch.quantile(rewards, quantile, dim=1, keepdim=True, interpolation=method)
    index = max(math.ceil(quantile * rewards.shape[1] - 1e-9), 1) - 1  # 1e-9: 0.6·5 is 3.0000000000000004
    return rewards.sort(dim=1).values[:, index:index + 1]


@ADVANTAGE_ESTIMATORS.register("qae", group_relative=True,
                               check=lambda group_size, options: check_quantile(options["quantile"]))
def qae_advantage(inputs: AdvantageInputs, *, quantile: float = 0.4, method: str = "inverted_cdf",
                  scale_by_std: bool = True, eps: float = 1e-6, std_unbiased: bool = True,
                  **_: object) -> torch.Tensor:
    """QAE: ``A = (r - Q_K(r_group)) / (std_g + eps)``, the group mean replaced by the K-quantile.

    Wu et al., "Quantile Advantage Estimation for Entropy-Safe Reasoning", arXiv 2509.22611.
    With binary rewards and pass rate p the baseline is 0 when ``p ≤ 1 - K`` (hard prompt: only
    successes are reinforced) and 1 otherwise (easy prompt: only failures are penalised).
    Open choices, both parameters: the quantile definition (``method="inverted_cdf"``, which
    gives exactly that two-regime gate; any `torch.quantile` interpolation otherwise) and
    whether GRPO's std scaling is kept (``scale_by_std=True``, the "replace only the mean"
    reading of the paper).
    """
    rewards = inputs.rewards
    check_quantile(quantile)
    adv = rewards - group_quantile(rewards, quantile, method)
    if scale_by_std:
        adv = adv / (rewards.std(dim=1, keepdim=True, unbiased=std_unbiased) + eps)
    return adv


def binary_successes(rewards: torch.Tensor, success_threshold: float | None) -> torch.Tensor:
    if success_threshold is not None:
        return rewards >= success_threshold
    if not ((rewards == 0) | (rewards == 1)).all():
        bad = rewards[(rewards != 0) & (rewards != 1)][0].item()
        raise ValueError(f"passk's closed form needs binary 0/1 rewards (found {bad}); pass "
                         "advantage_kwargs={'success_threshold': 1.0} to count r >= threshold as a success")
    return rewards == 1


def _check_passk(group_size: int, options: dict) -> None:
    k = options["k"]
    if not 1 <= k <= group_size:
        raise ValueError(f"passk needs 1 <= k <= group_size (got k={k}, group_size={group_size}); "
                         "set advantage_kwargs={'k': ...} or raise group_size")


@ADVANTAGE_ESTIMATORS.register("passk", group_relative=True, check=_check_passk)
def passk_advantage(inputs: AdvantageInputs, *, k: int = PASSK_DEFAULT_K, success_threshold: float | None = None,
                    eps: float = 1e-6, **_: object) -> torch.Tensor:
    """Pass@k training: the analytic advantage of each response under the pass@k group reward.

    Chen et al., "Pass@k Training for Adaptively Balancing Exploration and Exploitation of
    Large Reasoning Models", arXiv 2508.10751. Derivation (binary rewards, G responses of
    which c are correct): split the group into all ``C(G, k)`` k-subsets, score a subset 1 if
    it holds a success (its pass@k), normalise subset scores by their mean
    ``R̄ = 1 - C(G-c, k)/C(G, k)`` and std ``σ = √(R̄(1-R̄))`` (a Bernoulli's), and give each
    response the mean normalised score of the subsets that contain it:

    - correct response: every subset holding it scores 1, so ``A⁺ = (1 - R̄)/σ``;
    - wrong response: of the ``C(G-1, k-1)`` subsets holding it, ``C(G-c-1, k-1)`` hold no
      success, so ``A⁻ = (1 - C(G-c-1, k-1)/C(G-1, k-1) - R̄)/σ``.

    A group with ``σ = 0`` (no success, or a success in every k-subset, ``G - c < k``) gets 0.
    ``k = 1`` is GRPO with the population std. Needs ``1 ≤ k ≤ G``.

    Args:
        k: the k of pass@k (default 4).
        success_threshold: count ``r ≥ threshold`` as a success; None requires 0/1 rewards.
    """
    rewards = inputs.rewards
    n = rewards.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"passk needs 1 <= k <= group size (got k={k}, group size {n}); lower k in "
                         "advantage_kwargs or raise group_size")
    success = binary_successes(rewards, success_threshold)
    rows = []
    for c in success.sum(dim=1).tolist():
        mean = 1.0 - math.comb(n - c, k) / math.comb(n, k)
        std = math.sqrt(mean * (1.0 - mean))
        if std <= eps:
            rows.append((0.0, 0.0))
            continue
        miss_given_wrong = math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)
        rows.append(((1.0 - mean) / std, (1.0 - miss_given_wrong - mean) / std))
    values = torch.tensor(rows, dtype=rewards.dtype, device=rewards.device)
    return torch.where(success, values[:, :1], values[:, 1:])
