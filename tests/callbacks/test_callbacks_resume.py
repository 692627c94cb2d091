"""Each seed-method callback, and six of the seven together (EntropyGatedKL and
AccuracyConditionedKL both own ``kl_coef`` and refuse each other: each stack has one of them): a
fit stopped after N steps and resumed from its checkpoint reproduces the uninterrupted 2N-step fit
(same logged metrics at every step, same weights in fp32)."""
import pytest

from callback_helpers import make_data, make_module
from lightning_rlpt.callbacks import (AccuracyConditionedKL, CurriculumSampler, EntropyGatedKL, ESSScaledLR,
                                      ReferenceReset, ResponseWeightedKL, RewardDithering)
from resume_utils import assert_same_run, straight_and_resumed

VALIDATE = dict(val_check_interval=2, check_val_every_n_epoch=None)  # validations at steps 2, 4, 6: not at the stop (3)

CASES = {
    "entropy_gated_kl": (lambda: [EntropyGatedKL(warmup_steps=2, window=2, base_threshold=0.0)], {}, {}),
    "reference_reset_best": (lambda: [ReferenceReset(mode="best", every_n_validations=1)], {}, VALIDATE),
    "reference_reset_soft_lora": (lambda: [ReferenceReset(mode="soft", alpha=0.5, every_n_steps=2)],
                                  {"lora": dict(r=4, lora_alpha=8)}, {}),
    "response_weighted_kl": (lambda: [ResponseWeightedKL()], {}, {}),
    "accuracy_conditioned_kl": (lambda: [AccuracyConditionedKL(kl_max=0.1, smoothing=0.5)], {}, {}),
    "curriculum_sampler": (lambda: [CurriculumSampler(weighting="gaussian", epoch_size=8, dynamic_filtering=True,
                                                      max_refill_rounds=1)], {}, {}),
    "curriculum_loss_weights": (lambda: [CurriculumSampler(weighting="sqrt_variance", use_as="loss")], {}, {}),
    # VCPO's pair: the LR scaled by the ESS, the min-variance baseline as the module's estimator
    "ess_scaled_lr": (lambda: [ESSScaledLR()], {"engine": "off_policy", "advantage": "min_variance_offpolicy"}, {}),
    "reward_dithering": (lambda: [RewardDithering(scale=0.1, decay="linear", decay_steps=4)], {}, {}),
}


def all_but_one_kl_owner(kl_owner: str):
    """Every callback, with one of the two that own ``kl_coef`` (``safe`` or ``akl``)."""
    owner = (EntropyGatedKL(warmup_steps=2, window=2, base_threshold=0.0) if kl_owner == "safe"
             else AccuracyConditionedKL(kl_max=0.1))
    return [RewardDithering(scale=0.05), CurriculumSampler(epoch_size=8, dynamic_filtering=True, max_refill_rounds=1),
            owner, ResponseWeightedKL(), ESSScaledLR(), ReferenceReset(mode="best", every_n_validations=1)]


def _check(tmp_path, warm_start_dir, rows, val_rows, callbacks, settings, trainer_kwargs):
    straight, resumed = straight_and_resumed(
        tmp_path, lambda: make_module(warm_start_dir, **settings),
        lambda: make_data(rows, val_rows if trainer_kwargs else None, batch_size=4), callbacks, n=3, **trainer_kwargs)
    assert len(straight[0]) >= 6
    assert_same_run(straight, resumed)
    return straight


@pytest.mark.parametrize("case", list(CASES))
def test_each_callback_resumes_exactly(case, tmp_path, warm_start_dir, arithmetic_rows, held_out_rows):
    callbacks, settings, trainer_kwargs = CASES[case]
    metrics, _ = _check(tmp_path, warm_start_dir, arithmetic_rows[:16], held_out_rows[:4], callbacks, settings,
                        trainer_kwargs)
    prefix = {"entropy_gated_kl": "safe/", "reference_reset_best": "ref_reset/", "reference_reset_soft_lora": "ref_reset/",
              "response_weighted_kl": "rer/", "accuracy_conditioned_kl": "akl/", "curriculum_sampler": "curriculum/",
              "curriculum_loss_weights": "curriculum/", "ess_scaled_lr": "ess/", "reward_dithering": "redit/"}[case]
    assert any(k.startswith(prefix) for row in metrics.values() for k in row)


@pytest.mark.parametrize("order, kl_owner", [("listed", "safe"), ("reversed", "akl")])
def test_the_callbacks_together_resume_exactly(order, kl_owner, tmp_path, warm_start_dir, arithmetic_rows,
                                               held_out_rows):
    def callbacks():
        cbs = all_but_one_kl_owner(kl_owner)
        return cbs if order == "listed" else cbs[::-1]

    metrics, _ = _check(tmp_path, warm_start_dir, arithmetic_rows[:16], held_out_rows[:4], callbacks,
                        {"engine": "off_policy"}, VALIDATE)
    for prefix in (f"{kl_owner}/", "ref_reset/", "rer/", "curriculum/", "ess/", "redit/"):
        assert any(k.startswith(prefix) for row in metrics.values() for k in row), prefix
