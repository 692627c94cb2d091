"""BAPO: clip bounds chosen by hand over a few steps, the cross-rank reduction, state round trip,
bad arguments, and a short fit."""
from types import SimpleNamespace

import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.callbacks import BAPO

# (ratio, advantage) of five one-token sequences
TOKENS = [(1.29, 1.0), (1.0, 0.5), (0.62, -1.0), (0.72, -1.0), (1.0, -0.4)]


class FixedRatioBAPO(BAPO):
    """BAPO with the current/old ratio supplied by the test instead of a forward pass."""

    def __init__(self, ratio=None, **kw):
        super().__init__(**kw)
        self.ratio = ratio

    def current_ratio(self, module, minibatch):
        return self.ratio if minibatch.old_logprobs is not None else super().current_ratio(module, minibatch)


def minibatch(tokens=TOKENS, on_policy=False):
    n = len(tokens)
    return SimpleNamespace(advantages=torch.tensor([a for _, a in tokens]), completion_mask=torch.ones(n, 1),
                           old_logprobs=None if on_policy else torch.zeros(n, 1))


def fake_module():
    logged = {}
    return SimpleNamespace(knobs=SimpleNamespace(clip_low=0.2, clip_high=0.2), logged=logged,
                           loss_mask=lambda mb: mb.completion_mask.float(),
                           log=lambda name, value, **_: logged.__setitem__(name, value))


def step(bapo, module, mb, trainer=None):
    bapo.on_before_loss(trainer or SimpleNamespace(world_size=1), module, mb)
    return round(bapo.c_low, 6), round(bapo.c_high, 6)


def test_hand_computed_bounds_over_three_steps():
    ratio = torch.tensor([[r] for r, _ in TOKENS])
    bapo, module = FixedRatioBAPO(ratio), fake_module()
    # Step 1, target 1: at (0.6, 1.2) pos = 0.5 (1.29 > 1.2 is clipped), neg = 0.62 + 0.72 + 0.4;
    # c_low 0.65 drops 0.62 (pos/neg 0.45), 0.70 no change, 0.75 drops 0.72: 0.5/0.4 = 1.25 >= 1.
    assert step(bapo, module, minibatch()) == (0.75, 1.2)
    assert module.knobs.clip_low == pytest.approx(0.25) and module.knobs.clip_high == pytest.approx(0.2)
    assert bapo.pos_neg_ratio == pytest.approx(1.25)
    assert module.logged["bapo/c_low"] == pytest.approx(0.75)
    # Step 2, target 2: c_low to its max 0.9 (still 1.25), then c_high 1.25 (still), 1.30 admits
    # the 1.29 token: pos 1.29·1 + 1·0.5 = 1.79, ratio 1.79/0.4 = 4.475 >= 2.
    bapo.target_ratio = 2.0
    assert step(bapo, module, minibatch()) == (0.9, 1.3)
    assert bapo.pos_neg_ratio == pytest.approx(4.475)
    assert module.knobs.clip_low == pytest.approx(0.1) and module.knobs.clip_high == pytest.approx(0.3)
    # Step 3, on-policy (r = 1): bounds cannot change pos/neg = 1.5/2.4, so the search ends at the maxima.
    assert step(bapo, module, minibatch(on_policy=True)) == (0.9, 3.0)
    assert bapo.pos_neg_ratio == pytest.approx(1.5 / 2.4)
    assert bapo.steps == 3


def test_the_authors_clamped_measure_moves_the_wrong_way_on_c_low():
    ratio = torch.tensor([[r] for r, _ in TOKENS])
    bapo = FixedRatioBAPO(ratio, measure="clamped")
    path = bapo.search_path()
    sums = bapo.contributions(ratio, minibatch().advantages, torch.ones(5, 1), path)
    neg = sums[:, 1].tolist()
    assert neg[0] == pytest.approx(0.62 + 0.72 + 0.4) and neg[1] == pytest.approx(0.65 + 0.72 + 0.4)
    assert step(bapo, fake_module(), minibatch()) == (0.9, 3.0)  # never reaches 1: pos <= 1.79 < neg 2.2


def test_bounds_are_chosen_from_sums_reduced_over_ranks():
    """The other rank holds one positive token (r = 1, A = 2): globally pos 2.5 vs neg 1.74 at start."""
    ratio = torch.tensor([[r] for r, _ in TOKENS])
    other = torch.tensor([[2.0, 0.0]] * len(BAPO().search_path()), dtype=torch.float64)
    ops = []

    def reduce(t, reduce_op):
        ops.append(reduce_op)
        return t + other.flatten()

    trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device=torch.device("cpu"), reduce=reduce))
    bapo = FixedRatioBAPO(ratio)
    assert step(bapo, fake_module(), minibatch(), trainer) == (0.6, 1.2)
    assert ops == ["sum"] and bapo.pos_neg_ratio == pytest.approx(2.5 / 1.74)


def test_search_path_and_state_round_trip():
    bapo = FixedRatioBAPO(torch.tensor([[r] for r, _ in TOKENS]))
    path = bapo.search_path()
    assert len(path) == 1 + 6 + 36 and path[6] == pytest.approx((0.9, 1.2)) and path[-1] == pytest.approx((0.9, 3.0))
    step(bapo, fake_module(), minibatch())
    restored = BAPO()
    restored.load_state_dict(bapo.state_dict())
    assert restored.state_dict() == bapo.state_dict()
    assert bapo.state_dict() == pytest.approx({"c_low": 0.75, "c_high": 1.2, "pos_neg_ratio": 1.25, "steps": 1})


@pytest.mark.parametrize("kwargs,match", [
    (dict(low_bounds=(0.9, 0.6)), "low_bounds"),
    (dict(low_bounds=(0.6, 1.0)), "low_bounds"),
    (dict(high_bounds=(0.9, 2.0)), "high_bounds"),
    (dict(low_step=0.0), "steps"),
    (dict(target_ratio=0.0), "target_ratio"),
    (dict(measure="values"), "measure"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BAPO(**kwargs)


def test_refuses_losses_whose_knobs_are_not_token_ratio_bounds(warm_start_dir):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], objective="ctpo", group_size=4)
    with pytest.raises(ValueError, match="ctpo"):
        BAPO().setup(None, module, "fit")


def test_short_fit_moves_the_clip_knobs(warm_start_dir, arithmetic_rows):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, updates_per_rollout=2,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    bapo = BAPO()
    trainer = quiet_trainer(max_steps=2, callbacks=[bapo])
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert bapo.steps == 2
    assert 0.1 - 1e-9 <= module.knobs.clip_low <= 0.4 + 1e-9 and 0.2 - 1e-9 <= module.knobs.clip_high <= 2.0 + 1e-9
    assert module.knobs.clip_low == pytest.approx(1 - bapo.c_low) and module.knobs.clip_high == pytest.approx(bapo.c_high - 1)
    metrics = trainer.callback_metrics
    assert {"bapo/c_low", "bapo/c_high", "bapo/pos_neg_ratio"} <= set(metrics)
    assert all(torch.isfinite(v).all() for v in metrics.values())
