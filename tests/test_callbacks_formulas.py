"""Each seed-method callback against values computed by hand from its formula
(cited in each callback's docstring and docs/callbacks.md), first on its pure controller, then inside a tiny fit."""
import math

import pytest
import torch

from callback_helpers import make_data, make_module
from conftest import quiet_trainer
from lightning_rlpt import RLCallback
from lightning_rlpt.advantages import compute_advantages
from lightning_rlpt.callbacks import (AccuracyConditionedKL, CurriculumSampler, EntropyGatedKL, ESSScaledLR,
                                      ReferenceReset, ResponseWeightedKL, RewardDithering)
from lightning_rlpt.callbacks._common import seeded_generator
from lightning_rlpt.callbacks.curriculum_sampler import quantile_inf
from lightning_rlpt.weighted_sampler import WeightedEpochSampler


class Spy(RLCallback):
    """Calls ``fn(hook, trainer, module, x)`` at every RL hook and optimizer step."""

    def __init__(self, fn):
        self.fn = fn

    def on_rewards_computed(self, trainer, module, experience):
        self.fn("rewards", trainer, module, experience)

    def on_advantages_computed(self, trainer, module, experience):
        self.fn("advantages", trainer, module, experience)

    def on_before_loss(self, trainer, module, minibatch):
        self.fn("loss", trainer, module, minibatch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.fn("optimizer", trainer, pl_module, optimizer)


def fit(module, callbacks, rows, steps=2, batch_size=4, **kwargs):
    val = kwargs.pop("val_rows", None)
    trainer = quiet_trainer(max_steps=steps, callbacks=callbacks, **kwargs)
    trainer.fit(module, datamodule=make_data(rows, val, batch_size=batch_size))
    return trainer


# ---------------------------------------------------------------------------------- SAFE
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
    spy = Spy(lambda hook, t, m, x: hook == "loss" and seen.append((m.kl_coef, safe.kl_coef, safe.kl_smoothed)))
    fit(make_module(warm_start_dir), [safe, spy], arithmetic_rows[:8], steps=2)
    assert len(seen) == 2 and all(a == b for a, b, _ in seen)
    assert seen[1][0] > 0.01 and seen[1][2] > 0  # KL > 0 after a step: the coefficient rose


# ---------------------------------------------------------------------------------- REVA-PO
def test_rer_weights_match_the_formula(warm_start_dir, arithmetic_rows):
    checked = []

    def check(hook, trainer, module, exp):
        if hook != "advantages":
            return
        mask = exp.completion_mask.float()
        h = (exp.info["ref_entropy"] * mask).sum(1) / mask.sum(1)
        for i in range(len(exp)):
            grp = h[(i // 4) * 4:(i // 4) * 4 + 4]
            x = float((h[i] - grp.min()) / (grp.max() - grp.min() + 1e-6))
            a = float(exp.advantages[i])
            beta = 0.05 + 0.05 * (1 - x) if a > 0 else 0.10 + 0.02 * x if a < 0 else 0.10
            assert float(exp.kl_weights[i]) * 0.10 == pytest.approx(max(beta, 0.0), abs=1e-6)
        checked.append(len(exp))

    module = make_module(warm_start_dir)
    fit(module, [ResponseWeightedKL(), Spy(check)], arithmetic_rows[:8], steps=2)
    assert module.compute_ref_entropy and checked == [16, 16]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_soft_and_hard_reference_updates(lora, warm_start_dir, arithmetic_rows):
    from lightning_rlpt.models import reference_context, reference_pairs

    settings = {"lora": dict(r=4, lora_alpha=8)} if lora else {}
    module = make_module(warm_start_dir, **settings)
    reset = ReferenceReset(mode="soft", alpha=0.25, every_n_steps=2)
    snap = {}

    def record(hook, trainer, m, x):
        if hook == "rewards" and trainer.global_step == 0:
            snap["ref0"] = [r.detach().clone() for _, r in reference_pairs(m.policy, m.reference)]

    fit(module, [Spy(record), reset], arithmetic_rows[:8], steps=2)
    pairs = reference_pairs(module.policy, module.reference)
    assert len(pairs) > 0 and reset.syncs == 1
    for (theta, ref), ref0 in zip(pairs, snap["ref0"]):
        assert torch.allclose(ref, 0.25 * theta + 0.75 * ref0, atol=1e-6)
    hard = ReferenceReset(mode="hard", every_n_steps=1)
    fit(module, [hard], arithmetic_rows[:8], steps=1)
    exp_ids = torch.tensor([[1, 5, 6, 13, 7, 8, 14, 9]])
    with torch.no_grad(), reference_context(module.policy, module.reference) as ref:
        ref_logits = ref(exp_ids).logits
    assert torch.allclose(ref_logits, module.policy(exp_ids).logits, atol=1e-5)


def test_vapr_loads_the_best_validation_policy_into_policy_and_reference(warm_start_dir, arithmetic_rows, held_out_rows):
    from lightning_rlpt.models import reference_pairs

    module = make_module(warm_start_dir)
    reset = ReferenceReset(mode="best", every_n_validations=2)
    scores = []
    trainer = fit(module, [reset, Spy(lambda *a: None)], arithmetic_rows[:8], steps=2, val_rows=held_out_rows[:4],
                  val_check_interval=1, check_val_every_n_epoch=None)
    assert reset.validations == 2 and reset.resets == 1
    for name, p in module.policy.named_parameters():
        assert torch.equal(p.detach(), reset.best_weights[name])
    assert all(torch.equal(t, r) for t, r in reference_pairs(module.policy, module.reference))
    assert len(trainer.optimizers[0].state) == 0  # cleared at the reset
    del scores


# ---------------------------------------------------------------------------------- FG-ExPO AKL
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
            seen.append(("coef", module.kl_coef))

    fresh = AccuracyConditionedKL(kl_min=0.01, kl_max=0.2)
    fit(make_module(warm_start_dir), [fresh, Spy(check)], arithmetic_rows[:8], steps=2)
    for (_, acc), (_, coef) in zip(seen[::2], seen[1::2]):
        assert coef == pytest.approx(0.01 + 0.19 / (1 + math.exp(-10 * (acc - 0.5))))


# ---------------------------------------------------------------------------------- curricula
def test_curriculum_weightings_by_hand():
    p = torch.tensor([0.0, 0.25, 0.5, 0.9, float("nan")])
    lengths = torch.tensor([1.0, 2.0, 3.0, 4.0, float("nan")])
    g = CurriculumSampler("gaussian", sigma=0.2, min_weight=0.0, use_as="loss").weights_for(p, lengths)
    assert g.tolist() == pytest.approx([math.exp(-(x - 0.5) ** 2 / 0.08) for x in (0.0, 0.25, 0.5, 0.9, 0.5)])
    b = CurriculumSampler("beta", alpha=2.0, beta=0.5, min_weight=0.0, use_as="loss").weights_for(p, lengths)
    assert b.tolist() == pytest.approx([x ** 2 * (1 - x) ** 0.5 for x in (0.0, 0.25, 0.5, 0.9, 0.5)])
    s = CurriculumSampler("sqrt_variance", min_weight=0.1).weights_for(p, lengths)
    assert s.tolist() == pytest.approx([max((x * (1 - x)) ** 0.5, 0.1) for x in (0.0, 0.25, 0.5, 0.9, 0.5)])
    # LSPO: Q(0.25) = 1 and Q(0.75) = 3 over the four seen lengths; keep <= 1 or >= 3; unseen kept
    l_w = CurriculumSampler("length", length_quantiles=(0.25, 0.75), min_weight=0.0, use_as="loss").weights_for(p, lengths)
    assert l_w.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert quantile_inf(torch.tensor([4.0, 1.0, 3.0, 2.0]), 0.5) == 2.0


def test_pass_rate_ema_and_loss_weights(warm_start_dir, arithmetic_rows):
    cs = CurriculumSampler("sqrt_variance", use_as="loss", ema=0.25)
    cs.observe([3, 5], [1.0, 0.5], [4.0, 2.0])
    cs.observe([3], [0.0], [2.0])
    assert cs.stats[3] == pytest.approx((0.75, 3.5)) and cs.stats[5] == (0.5, 2.0)
    checked = []

    def check(hook, trainer, module, exp):
        if hook == "advantages":
            idx = exp.columns["index"][::4]
            p = [cur.stats[i][0] for i in idx]
            w = torch.tensor([max((x * (1 - x)) ** 0.5, 0.01) for x in p])
            assert exp.sample_weights.tolist() == pytest.approx((w / w.mean()).repeat_interleave(4).tolist(), abs=1e-6)
            checked.append(p)

    cur = CurriculumSampler("sqrt_variance", use_as="loss")
    fit(make_module(warm_start_dir), [cur, Spy(check)], arithmetic_rows[:8], steps=2)
    assert len(checked) == 2 and len(cur.stats) == 8


def test_weighted_sampler_draws_from_the_weights_and_filtering_keeps_informative_groups(warm_start_dir, arithmetic_rows):
    groups = []

    def check(hook, trainer, module, exp):
        if hook == "advantages":
            r = exp.rewards_per_func[:, 0].view(-1, 4)
            groups.append(((r.max(1).values - r.min(1).values) > 0).all().item())

    cur = CurriculumSampler("gaussian", epoch_size=8, dynamic_filtering=True, max_refill_rounds=1)
    # A small lr keeps the warm start's mixed outcomes (lr 1e-3 collapses it to all-wrong in one step).
    trainer = fit(make_module(warm_start_dir, lr=1e-5), [cur, Spy(check)], arithmetic_rows[:16], steps=2)
    assert len(groups) == 2 and all(groups)
    assert trainer.callback_metrics["curriculum/kept_groups"] > 0
    assert cur.sampler.snapshot.shape == (16,) and cur.sampler.snapshot_epoch is not None
    order = list(cur.sampler)
    assert len(order) == 8 and set(order) <= set(range(16))
    s = WeightedEpochSampler(6, lambda: torch.tensor([0.0, 5.0, 0.0, 1.0, 0.0, 2.0]), seed=1, epoch_size=3,
                             replacement=False)
    s.set_epoch(4)
    assert sorted(s) == [1, 3, 5]


def test_default_sampler_draws_prompts_as_often_as_their_weights_say():
    """With the defaults (epoch = dataset size) a draw without replacement would be a permutation:
    every prompt once per epoch, whatever the weights. With replacement the weights set the counts."""
    weights = torch.tensor([0.01, 1.0, 1.0, 0.01])
    s = WeightedEpochSampler(4, lambda: weights, seed=0)
    counts = torch.zeros(4)
    for epoch in range(50):
        s.set_epoch(epoch)
        for i in s:
            counts[i] += 1
    assert counts.sum() == 200
    heavy, light = counts[[1, 2]].min(), counts[[0, 3]].max()
    assert heavy >= 10 * max(light.item(), 1), counts.tolist()
    permutation = WeightedEpochSampler(4, lambda: weights, seed=0, replacement=False)
    permutation.set_epoch(0)
    assert sorted(permutation) == [0, 1, 2, 3]  # the old default: weights only reorder


def test_curriculum_sampling_mode_uses_draws_with_replacement(warm_start_dir, arithmetic_rows):
    cur = CurriculumSampler("gaussian")
    fit(make_module(warm_start_dir, lr=1e-5), [cur], arithmetic_rows[:8], steps=1)
    assert cur.sampler.replacement and cur.sampler.n == 8


# ---------------------------------------------------------------------------------- VCPO
def test_ess_scales_the_lr_of_the_step_and_restores_it(warm_start_dir, arithmetic_rows):
    events = []

    def check(hook, trainer, module, x):
        if hook == "loss":
            m = x.completion_mask.double()
            w = torch.exp(((x.old_logprobs.double() - x.behaviour_logprobs.double()) * m).sum(1))
            rho = float(w.sum() ** 2 / ((w ** 2).sum() + 1e-8)) / len(w)
            events.append(("expect", math.sqrt(min(1.0, rho)), rho))
        if hook == "optimizer":
            events.append(("lr", x.param_groups[0]["lr"], None))

    module = make_module(warm_start_dir, engine="off_policy", lr=1e-3)
    trainer = fit(module, [ESSScaledLR(), Spy(check)], arithmetic_rows[:8], steps=2)
    pairs = list(zip(events[::2], events[1::2]))
    assert len(pairs) == 2
    for (_, factor, rho), (_, lr, _) in pairs:
        assert rho < 0.99 and lr == pytest.approx(1e-3 * factor, rel=1e-9)
    assert trainer.optimizers[0].param_groups[0]["lr"] == 1e-3  # restored after the step


def test_ess_leaves_the_lr_unchanged_on_policy(warm_start_dir, arithmetic_rows):
    lrs = []
    module = make_module(warm_start_dir, engine="on_policy", lr=1e-3)
    fit(module, [ESSScaledLR(rule="linear"), Spy(lambda h, t, m, x: h == "optimizer" and lrs.append(x.param_groups[0]["lr"]))],
        arithmetic_rows[:8], steps=2)
    assert lrs == [1e-3, 1e-3]


def test_min_variance_baseline_by_hand():
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    w = torch.tensor([2.0, 1.0, 0.5, 1.0])
    g = torch.tensor([1.0, 2.0, 1.0, 1.0])
    big_w = [1 * 4, 2 * 1, 1 * 0.25, 1 * 1]
    b = (4 * 1 + 0 + 0.25 * 1 + 0) / (sum(big_w) + 1e-8)
    got = compute_advantages("min_variance_offpolicy", r.view(-1), 4, is_weights=w, grad_sq_norms=g)
    assert got.tolist() == pytest.approx([1 - b, -b, 1 - b, -b])
    assert compute_advantages("min_variance_offpolicy", r.view(-1), 4).tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])


# ---------------------------------------------------------------------------------- ReDit
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
    for t, (a, b) in enumerate(zip(raw, noisy)):
        scale = 0.1 * (1 - t / 2)
        g = seeded_generator(11, t, 0)  # keyed by (seed, rollout, rank)
        draw = torch.randn(16, generator=g) if distribution == "gaussian" else torch.rand(16, generator=g) * 2 - 1
        assert torch.allclose(b - a, draw * scale, atol=1e-7)
