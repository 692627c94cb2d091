"""Bad input to the seed-method callbacks fails early, saying what was wrong and how to fix it."""
import pytest

from callback_helpers import make_data, make_module
from conftest import quiet_trainer
from lightning_rlpt import RLCallback
from lightning_rlpt.callbacks import (AccuracyConditionedKL, CurriculumSampler, EntropyGatedKL, ESSScaledLR,
                                      ReferenceReset, ResponseWeightedKL, RewardDithering)


@pytest.mark.parametrize("make, match", [
    (lambda: RewardDithering(scale=-0.1), "noise scale must be > 0"),
    (lambda: RewardDithering(distribution="laplace"), "distribution must be one of"),
    (lambda: RewardDithering(decay="linear"), "needs decay_steps"),
    (lambda: CurriculumSampler("gaussian", sigma=0.0), "sigma must be > 0"),
    (lambda: CurriculumSampler("beta", alpha=-1.0), "alpha and beta must be >= 0"),
    (lambda: CurriculumSampler("length", length_quantiles=(0.8, 0.2)), "inverted"),
    (lambda: CurriculumSampler("gaussian", min_weight=0.0), "min_weight > 0"),
    (lambda: CurriculumSampler("zipf"), "weighting must be one of"),
    (lambda: EntropyGatedKL(threshold_range=(0.6, 0.1)), "inverted"),
    (lambda: EntropyGatedKL(kl_smoothing=1.0), "kl_smoothing must be in"),
    (lambda: EntropyGatedKL(phase_multipliers={"warmup": -1.0}), "phase_multipliers"),
    (lambda: AccuracyConditionedKL(kl_min=0.2, kl_max=0.1), "inverted"),
    (lambda: AccuracyConditionedKL(steepness=0.0), "steepness must be > 0"),
    (lambda: ResponseWeightedKL(b_min=0.2, b_base=0.1), "inverted"),
    (lambda: ReferenceReset(mode="soft", alpha=0.0), "alpha must be in"),
    (lambda: ReferenceReset(mode="sometimes"), "mode must be one of"),
    (lambda: ESSScaledLR(rule="cubic"), "rule must be one of"),
    (lambda: ESSScaledLR(rho_base=0.0), "rho_base must be in"),
])
def test_out_of_range_parameters_fail_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _fit(module, callbacks, rows, val_rows=None, **kwargs):
    quiet_trainer(max_steps=1, callbacks=callbacks, **kwargs).fit(module, datamodule=make_data(rows, val_rows))


@pytest.mark.parametrize("callback", [EntropyGatedKL, ResponseWeightedKL, AccuracyConditionedKL, ReferenceReset])
def test_kl_callbacks_need_a_reference(callback, warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir, kl_coef=0.0)
    assert not module.use_reference
    with pytest.raises(ValueError, match=rf"{callback.__name__} drives the KL-to-reference term.*pass reference=True"):
        _fit(module, [callback()], arithmetic_rows[:4])


def test_vapr_without_a_validation_loop_names_the_metric(warm_start_dir, arithmetic_rows):
    with pytest.raises(ValueError, match=r"best 'val/accuracy'.*no validation loop.*val_data="):
        _fit(make_module(warm_start_dir), [ReferenceReset(mode="best")], arithmetic_rows[:4])


def test_vapr_with_a_metric_validation_does_not_log(warm_start_dir, arithmetic_rows, held_out_rows):
    with pytest.raises(ValueError, match=r"monitors 'val/bleu', which validation did not log.*val/accuracy"):
        _fit(make_module(warm_start_dir), [ReferenceReset(mode="best", monitor="val/bleu")], arithmetic_rows[:4],
             held_out_rows[:2], val_check_interval=1, check_val_every_n_epoch=None)


def test_ess_with_an_engine_without_behaviour_logprobs_says_how_to_get_them(warm_start_dir, arithmetic_rows):
    from lightning_rlpt import HFGenerateEngine

    module = make_module(warm_start_dir)
    module.rollout_engine = HFGenerateEngine(module.policy, module.tokenizer.eos_token_id, module.tokenizer.pad_token_id)
    with pytest.raises(ValueError, match=r"needs behaviour log-probs.*return_logprobs=True.*rollout_logprobs=True"):
        _fit(module, [ESSScaledLR()], arithmetic_rows[:4])


@pytest.mark.parametrize("option", [{}, {"rollout_logprobs": True}])
def test_ess_gets_behaviour_logprobs_from_the_modules_own_engine(option, warm_start_dir, arithmetic_rows):
    """ESSScaledLR asks for them (module.request); the public option gives them to any callback."""
    module = make_module(warm_start_dir, **option)
    seen = []

    class Behaviour(RLCallback):
        def on_before_loss(self, trainer, module, minibatch):
            seen.append(minibatch.behaviour_logprobs is not None)

    _fit(module, [ESSScaledLR(), Behaviour()], arithmetic_rows[:4])
    assert seen == [True]


def test_sampling_curriculum_needs_a_prompt_datamodule(warm_start_dir, arithmetic_rows):
    from torch.utils.data import DataLoader

    from lightning_rlpt.data import PromptDataset, collate_prompts
    loader = DataLoader(PromptDataset(arithmetic_rows[:4]), batch_size=2, collate_fn=collate_prompts)
    with pytest.raises(ValueError, match="datamodule=PromptDataModule"):
        quiet_trainer(max_steps=1, callbacks=[CurriculumSampler()]).fit(make_module(warm_start_dir), train_dataloaders=loader)


class PlainModule(__import__("lightning").LightningModule):
    """An ordinary LightningModule: no RL hooks, no knobs."""


@pytest.mark.parametrize("callback, match", [
    (lambda: RewardDithering(), r"RewardDithering acts at RLModule's hook points, which PlainModule never calls"),
    (lambda: ESSScaledLR(), r"ESSScaledLR uses module.request"),
    (lambda: EntropyGatedKL(), r"EntropyGatedKL uses module.knobs, which PlainModule does not have"),
    (lambda: AccuracyConditionedKL(), r"AccuracyConditionedKL uses module.knobs"),
    (lambda: ResponseWeightedKL(), r"ResponseWeightedKL uses module.use_reference"),
    (lambda: ReferenceReset(mode="hard"), r"ReferenceReset uses module.policy"),
    (lambda: CurriculumSampler(use_as="loss"), r"CurriculumSampler uses module.group_size"),
])
def test_a_module_without_the_knob_is_named_at_setup(callback, match):
    with pytest.raises(ValueError, match=match):
        callback().setup(None, PlainModule(), "fit")


def test_bapo_on_a_module_without_clip_knobs():
    from lightning_rlpt.callbacks import BAPO

    with pytest.raises(ValueError, match=r"BAPO uses module.knobs"):
        BAPO().setup(None, PlainModule(), "fit")


def test_a_module_with_the_knobs_but_no_rl_hooks_is_refused():
    module = PlainModule()
    module.knobs, module.use_reference, module.success_threshold = object(), True, 1.0
    with pytest.raises(ValueError, match=r"AccuracyConditionedKL acts at RLModule's hook points, which PlainModule never"):
        AccuracyConditionedKL().setup(None, module, "fit")
