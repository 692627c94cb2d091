"""Issue 23 item 7: option dictionaries are checked against the selected function's signature at
construction (a misspelt key is refused, naming it, the function, its options and a close
match), and estimator checks take their defaults from the signature."""
import inspect

import pytest

import tiny_task as task
from lightning_rlpt import RLModule
from lightning_rlpt.algorithms.advantages import ADVANTAGE_ESTIMATORS
from lightning_rlpt.algorithms.losses import POLICY_LOSSES
from lightning_rlpt.algorithms.losses.base import MODULE_OPTIONS
from lightning_rlpt.algorithms.presets import check_objective, resolve_objective
from lightning_rlpt.registry import Registry


def build(warm_start_dir, **kwargs):
    return RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(policy_loss_kwargs={"basline": .1}),
     r"policy_loss_kwargs\['basline'\]: policy loss 'ppo_clip' has no option 'basline'; its options: none"),
    (dict(advantage_kwargs={"epz": 3}),
     r"advantage_kwargs\['epz'\]: advantage estimator 'grpo' has no option 'epz' \(did you mean 'eps'\?\); "
     r"its options: eps, std_unbiased"),
    (dict(objective="ctpo", policy_loss_kwargs={"powr": 1.0}),
     r"policy loss 'ctpo' has no option 'powr' \(did you mean 'power'\?\); its options: dual_clip_coef, max_log_ratio, power"),
    (dict(policy_loss_kwargs={"clip_low": 0.1}),
     r"policy_loss_kwargs\['clip_low'\]: the module passes 'clip_low' to every policy loss itself"),
], ids=["loss-typo", "advantage-typo", "close-match", "module-supplied"])
def test_unknown_options_are_refused_at_construction(warm_start_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build(warm_start_dir, **kwargs)


def test_known_options_build(warm_start_dir):
    module = build(warm_start_dir, objective="ctpo", policy_loss_kwargs={"power": 1.0}, advantage_kwargs={"eps": 1e-3})
    assert module.policy_loss_kwargs == {"power": 1.0} and module.advantage_kwargs == {"eps": 1e-3}


def test_estimator_checks_see_the_signature_defaults():
    """passk's check reads ``k`` without a default of its own: the signature's (4) reaches it."""
    assert ADVANTAGE_ESTIMATORS.options("passk")["k"] == 4
    with pytest.raises(ValueError, match=r"got k=4, group_size=3"):
        check_objective(resolve_objective("grpo", dict(advantage="passk")), group_size=3)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_takes_what_the_module_passes_and_its_options_exclude_it(name):
    params = inspect.signature(POLICY_LOSSES.get(name)).parameters.values()
    swallows = any(p.kind is p.VAR_KEYWORD for p in params)
    assert swallows or set(MODULE_OPTIONS) <= {p.name for p in params}, f"{name} would refuse the module's options"
    assert POLICY_LOSSES.check_options(name, {}, "policy_loss_kwargs", supplied=MODULE_OPTIONS).keys().isdisjoint(
        MODULE_OPTIONS)


def test_a_member_reading_its_own_kwargs_is_not_checked():
    family = Registry("toy")

    @family.register("free")
    def free(x, **options):
        return options

    @family.register("strict")
    def strict(x, *, scale: float = 1.0, **_):
        return x * scale

    assert family.options("free") is None and family.check_options("free", {"anything": 1}, "kw") == {"anything": 1}
    assert family.check_options("strict", {}, "kw") == {"scale": 1.0}
    with pytest.raises(ValueError, match=r"kw\['scael'\]: toy 'strict' has no option 'scael' \(did you mean 'scale'\?\)"):
        family.check_options("strict", {"scael": 2.0}, "kw")
