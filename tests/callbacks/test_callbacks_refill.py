"""Dynamic filtering's refills and the callbacks around it: every sample that enters the batch is
dithered exactly once, controllers update once per training batch on the assembled batch, and
neither depends on whether the callback is listed before or after the filter."""
import pytest
import torch

from callback_helpers import make_data, make_module
from conftest import quiet_trainer
from lightning_rlpt import RLCallback
from lightning_rlpt.callbacks import AccuracyConditionedKL, CurriculumSampler, RewardDithering


def half_constant(prompts, completions, kind, completion_ids, **_):
    """0 on "constant" rows (their groups have zero variance: always filtered, always refilled)."""
    return [0.0 if k == "constant" else float(len(ids) % 2) for k, ids in zip(kind, completion_ids)]


class Watch(RLCallback):
    """Counts rollouts (sampled + refills) and keeps each assembled batch as trained on."""

    def __init__(self):
        self.rollouts, self.batches = 0, []

    def on_rollout_end(self, trainer, module, experience):
        self.rollouts += 1

    def on_advantages_computed(self, trainer, module, experience):
        self.batches.append((experience.rewards.clone(), module.rewards.combine(experience.rewards_per_func).clone(),
                             list(experience.columns["index"])))


def _rows(arithmetic_rows):
    return [{**r, "kind": "constant" if i % 2 else "parity"} for i, r in enumerate(arithmetic_rows[:16])]


def _fit(warm_start_dir, rows, callbacks, steps=3):
    module = make_module(warm_start_dir, reward_funcs=[half_constant], lr=1e-4, success_threshold=0.5)
    quiet_trainer(max_steps=steps, callbacks=callbacks).fit(module, datamodule=make_data(rows, batch_size=4))
    return module


def _filter():
    return CurriculumSampler(None, use_as="loss", dynamic_filtering=True, max_refill_rounds=2, seed=3)


@pytest.mark.parametrize("dither_first", [True, False])
def test_dithering_applies_once_per_sample_and_counts_batches_not_refills(dither_first, warm_start_dir, arithmetic_rows):
    dither, watch = RewardDithering(scale=0.05, decay="linear", decay_steps=4, seed=1), Watch()
    callbacks = [dither, _filter()] if dither_first else [_filter(), dither]
    _fit(warm_start_dir, _rows(arithmetic_rows), callbacks + [watch])
    assert watch.rollouts > 3, "no refill happened: the test would not exercise refills"
    assert dither.rollouts == 3  # one decay step per training batch, however many refills
    assert len(watch.batches) == 3  # every batch trained on is checked below
    for t, (noisy, raw, _) in enumerate(watch.batches):
        expected = dither.noise(len(noisy), dither.scale_at(t), t, 0)
        assert torch.allclose(noisy - raw, expected, atol=1e-7)  # each sample dithered exactly once


def test_dithering_result_does_not_depend_on_the_callback_order(warm_start_dir, arithmetic_rows):
    runs = []
    for order in ("dither_first", "filter_first"):
        dither, watch = RewardDithering(scale=0.05, seed=1), Watch()
        callbacks = [dither, _filter()] if order == "dither_first" else [_filter(), dither]
        module = _fit(warm_start_dir, _rows(arithmetic_rows), callbacks + [watch])
        runs.append((watch.batches, {k: v.clone() for k, v in module.policy.state_dict().items()}))
    (b0, w0), (b1, w1) = runs
    assert len(b0) == len(b1) == 3  # every training batch of both orders is compared
    for (n0, r0, i0), (n1, r1, i1) in zip(b0, b1):
        assert i0 == i1 and torch.equal(n0, n1) and torch.equal(r0, r1)
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


@pytest.mark.parametrize("akl_first", [True, False])
def test_akl_updates_once_per_batch_from_the_assembled_batch(akl_first, warm_start_dir, arithmetic_rows):
    akl, watch = AccuracyConditionedKL(kl_min=0.0, kl_max=0.1), Watch()
    seen = []

    class Coef(RLCallback):
        def on_before_loss(self, trainer, module, minibatch):
            seen.append(module.knobs.kl_coef)

    observed = []
    original = akl.observe
    akl.observe = lambda accuracy: observed.append(accuracy) or original(accuracy)
    callbacks = [akl, _filter()] if akl_first else [_filter(), akl]
    _fit(warm_start_dir, _rows(arithmetic_rows), callbacks + [watch, Coef()])
    assert watch.rollouts > 3, "no refill happened"
    assert len(observed) == 3  # once per training batch, not once per refill
    assert len(seen) == len(watch.batches) == 3  # one optimizer step per batch: every coefficient is checked
    for accuracy, coef, (_, raw, _) in zip(observed, seen, watch.batches):
        assert accuracy == pytest.approx((raw >= 0.5).float().mean().item())  # the batch trained on
        assert coef == pytest.approx(akl.coefficient(accuracy))
