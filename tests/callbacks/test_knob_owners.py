"""One owner per knob (issue 23, item 6): two callbacks that move one knob are refused at setup,
naming both, instead of the later one silently overwriting the other every step; claims do not
outlive their fit."""
import pytest

from callback_helpers import fit, make_data, make_module
from conftest import quiet_trainer
from lightning_rlpt import Knobs
from lightning_rlpt.callbacks import BAPO, AccuracyConditionedKL, EntropyGatedKL


@pytest.mark.parametrize("first, second", [(EntropyGatedKL, AccuracyConditionedKL),
                                           (AccuracyConditionedKL, EntropyGatedKL)])
def test_two_kl_controllers_on_one_trainer_are_refused_naming_both(first, second, warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir)
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    with pytest.raises(ValueError, match=rf"'kl_coef' is already moved by {first.__name__}; {second.__name__} would"):
        fit(module, [first(), second()], arithmetic_rows[:8], steps=1)
    assert all((before[k] == v).all() for k, v in module.policy.state_dict().items())  # refused before any step


def test_two_bapos_are_refused_on_the_clip_knobs(warm_start_dir, arithmetic_rows):
    with pytest.raises(ValueError, match=r"'clip_low' is already moved by BAPO; BAPO would"):
        fit(make_module(warm_start_dir), [BAPO(), BAPO(target_ratio=2.0)], arithmetic_rows[:8], steps=1)


def test_claims_hold_for_their_fit_only(warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir)
    safe = EntropyGatedKL()
    trainer = quiet_trainer(max_steps=1, callbacks=[safe])
    trainer.fit(module, datamodule=make_data(arithmetic_rows[:8], batch_size=4))
    assert module.knobs.owner("kl_coef") is safe
    trainer.fit(module, datamodule=make_data(arithmetic_rows[:8], batch_size=4))  # the same Trainer again: its own claim
    akl = AccuracyConditionedKL()
    fit(module, [akl], arithmetic_rows[:8], steps=1)  # a new Trainer without SAFE takes the knob over
    assert module.knobs.owner("kl_coef") is akl


def test_claim_names_an_unknown_knob():
    with pytest.raises(ValueError, match=r"claims knob 'kl_cof', which does not exist; knobs: \['kl_coef'"):
        Knobs(0.0, 0.2, 0.2).claim("kl_cof", owner=object())
