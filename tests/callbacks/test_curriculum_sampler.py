"""CurriculumSampler and WeightedEpochSampler (curricula, DAPO filtering): the callback against values
computed by hand from its formula (cited in its docstring and docs/callbacks.md), on its pure
controller and inside a tiny fit."""
import math

import pytest
import torch

from callback_helpers import Spy, fit, make_module
from lightning_rlpt.callbacks import CurriculumSampler
from lightning_rlpt.callbacks.curriculum_sampler import quantile_inf
from lightning_rlpt.data.samplers import WeightedEpochSampler


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
    # The next epoch draws from the weights of what was observed: the gaussian of each prompt's
    # pass rate (unseen: the prior 0.5), floored at 0.01, by hand from the curriculum's statistics...
    seen = {i: p for i, (p, _) in cur.stats.items()}
    assert 0 < len(seen) < 16 and any(abs(p - 0.5) > 0.1 for p in seen.values())  # the weights are not flat
    weights = torch.tensor([max(math.exp(-(seen.get(i, 0.5) - 0.5) ** 2 / (2 * 0.25 ** 2)), 0.01) for i in range(16)],
                           dtype=torch.float64)
    cur.sampler.set_epoch(1)
    assert torch.allclose(cur.sampler.snapshot, weights, rtol=1e-12)
    # ...and the order is the documented draw: 8 with replacement, seeded by the data seed + epoch.
    order = list(cur.sampler)
    expected = torch.multinomial(weights, 8, replacement=True, generator=torch.Generator().manual_seed(7 + 1)).tolist()
    assert order == expected
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
