"""EntropyGatedKL (SAFE): the callback against values computed by hand from its formula (cited in its
docstring and docs/callbacks.md), on its pure controller and inside a tiny fit."""

import pytest

from callback_helpers import Spy, fit, make_module
from lightning_rlpt.callbacks import EntropyGatedKL


def safe_by_hand(seq, warmup, window):
    """SAFE from its formulas (docs/callbacks.md), written out independently of the callback."""
    kl_s = ema = None
    integral = prev_err = 0.0
    hist, out = [], []
    for t, (r, kl, h) in enumerate(seq):
        kl_s = kl if kl_s is None else 0.9 * kl_s + 0.1 * kl
        prev = r if ema is None else ema
        ema = r if ema is None else 0.95 * ema + 0.05 * r
        err = (ema - prev) - 0.001
        integral = max(-1.0, min(1.0, integral + err))
        u = 0.3 * err + 0.01 * integral + 0.05 * (err - prev_err)
        prev_err = err
        hist.append(r)
        if t < warmup:
            m = 1.5
        else:
            last, before = hist[-window:], hist[-2 * window:-window]
            mean = sum(last) / len(last)
            std = (sum((x - mean) ** 2 for x in last) / len(last)) ** 0.5
            m = 1.2 if before and mean > sum(before) / len(before) + 0.01 else 1.0 if std < 0.02 and mean > 0.7 else 0.8
        tau = min(max((0.3 + u) * m, 0.1), 0.6)
        gate = max(0.5, 2.0 / (h + 0.1))
        coef = 0.02 + (2 * 0.1 * (kl_s - tau) * gate if kl_s > tau else 0.0)
        out.append((tau, m, u, coef))
    return out


@pytest.mark.parametrize("rewards", [[0.1, 0.2, 0.4, 0.6, 0.8, 0.9], [0.8] * 6, [0.3] * 6])
def test_safe_threshold_phase_pid_and_coefficient_match_the_formula(rewards):
    seq = [(r, kl, h) for r, kl, h in zip(rewards, [0.2, 0.9, 1.5, 0.4, 2.0, 0.1], [0.5, 3.0, 0.05, 1.0, 0.2, 2.0])]
    safe = EntropyGatedKL(base_kl_coef=0.02, warmup_steps=2, window=2)
    got = [safe.observe(*x) for x in seq]
    for g, (tau, m, u, coef) in zip(got, safe_by_hand(seq, 2, 2)):
        assert g["threshold"] == pytest.approx(tau, abs=1e-12)
        assert g["phase_multiplier"] == m and g["pid_u"] == pytest.approx(u, abs=1e-12)
        assert g["kl_coef"] == pytest.approx(coef, abs=1e-12)
    phases = {tuple(rewards): g["phase"] for g in got[-1:]}
    expected_last = {0.1: 1.0, 0.8: 2.0, 0.3: 3.0}[rewards[0]]  # climbing, converged, plateau
    assert phases[tuple(rewards)] == expected_last
    assert any(g["kl_coef"] > 0.02 for g in got)  # the gate opened at least once


@pytest.mark.parametrize("warmup, window", [(150, 50), (10, 2)])
def test_safe_warmup_ends_after_warmup_steps_even_when_longer_than_two_windows(warmup, window):
    safe = EntropyGatedKL(warmup_steps=warmup, window=window)
    phases = [safe.observe(mean_reward=0.3, kl=0.1, entropy=1.0)["phase"] for _ in range(warmup + 5)]
    assert phases[:warmup] == [0.0] * warmup  # warmup
    assert phases[warmup:] == [3.0] * 5  # constant 0.3 rewards: plateau, once the warm-up is over
    assert len(safe.rewards) == 2 * window  # the phase windows stay bounded
    resumed = EntropyGatedKL(warmup_steps=warmup, window=window)
    half = EntropyGatedKL(warmup_steps=warmup, window=window)
    for _ in range(warmup - 1):
        half.observe(mean_reward=0.3, kl=0.1, entropy=1.0)
    resumed.load_state_dict(half.state_dict())  # a checkpoint one rollout before the end of warm-up
    assert [resumed.observe(mean_reward=0.3, kl=0.1, entropy=1.0)["phase"] for _ in range(2)] == [0.0, 3.0]


def test_safe_sets_the_module_kl_coefficient_for_the_step(warm_start_dir, arithmetic_rows):
    seen = []
    safe = EntropyGatedKL(base_kl_coef=0.01, base_threshold=-1.0, threshold_range=(0.0, 0.6))  # τ = 0: gate open
    spy = Spy(lambda hook, t, m, x: hook == "loss" and seen.append((m.knobs.kl_coef, safe.kl_coef, safe.kl_smoothed)))
    fit(make_module(warm_start_dir), [safe, spy], arithmetic_rows[:8], steps=2)
    assert len(seen) == 2 and all(a == b for a, b, _ in seen)
    assert seen[1][0] > 0.01 and seen[1][2] > 0  # KL > 0 after a step: the coefficient rose
