"""Every field of the installed TRL's ``GRPOConfig`` is mapped, refused with a hint, or ignored with
a reason (`lightning_rlpt.compat.trl_fields`), with TRL's own defaults; and a real ``GRPOConfig``,
the dict of its fields and the stand-in convert alike. A new TRL release that adds a field or moves
a default fails here, not silently in a user's run."""
import dataclasses

import pytest

from lightning_rlpt.compat import trl as compat
from lightning_rlpt.compat.trl_fields import IGNORED, REFUSED, REMOVED, TRL_DEFAULTS
from parity_trl import GRPOConfig, trl_config

FIELDS = {f.name: f for f in dataclasses.fields(GRPOConfig)}
# Defaults TRL's __post_init__ derives (from other fields or the machine), which the tables keep undecided.
DERIVED = {"generation_batch_size", "steps_per_generation", "bf16", "output_dir"}


def declared(f):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def test_every_field_is_mapped_refused_or_ignored_and_no_other_is_listed():
    tables = {**dict.fromkeys(TRL_DEFAULTS, "mapped"), **dict.fromkeys(REFUSED, "refused"),
              **dict.fromkeys(IGNORED, "ignored")}
    assert sorted(set(FIELDS) - set(tables)) == [], "GRPOConfig fields in no table"
    assert sorted(set(tables) - set(FIELDS)) == [], "listed fields the installed GRPOConfig lacks (move to REMOVED)"
    assert not set(REMOVED) & set(FIELDS), "a REMOVED field is back in GRPOConfig"
    assert len(TRL_DEFAULTS) + len(REFUSED) + len(IGNORED) == len(FIELDS)  # no field in two tables
    assert all(reason for reason in IGNORED.values()) and all(hint for _, hint in REFUSED.values())


@pytest.mark.parametrize("name", sorted(TRL_DEFAULTS))
def test_mapped_defaults_are_the_installed_trls(name):
    if name in DERIVED:
        pytest.skip(f"{name}'s default is derived by GRPOConfig.__post_init__")
    assert TRL_DEFAULTS[name] == declared(FIELDS[name])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_fields_accept_the_installed_trls_default(name):
    assert declared(FIELDS[name]) in REFUSED[name][0]
    assert getattr(trl_config(), name) in REFUSED[name][0]  # after __post_init__ as well


CONFIGS = [
    dict(beta=0.04, loss_type="grpo", num_generations=4, per_device_train_batch_size=8, max_steps=10, seed=3),
    dict(importance_sampling_level="sequence", beta=0.01, epsilon=3e-4, epsilon_high=4e-4, num_iterations=2),
    dict(loss_type="vespo", vllm_importance_sampling_mode="token_mask", entropy_coef=0.01, top_entropy_quantile=0.5),
    dict(loss_type="cispo", epsilon_high=5.0, scale_rewards="batch", lr_scheduler_type="cosine", warmup_steps=0.1,
         mask_truncated_completions=True, reward_weights=[1.0, 0.5], report_to="tensorboard", save_steps=50),
]


def comparable(args):
    schedule = args.module.get("lr_scheduler")
    return ({**args.module, "lr_scheduler": (schedule.func, schedule.keywords) if schedule else None},
            args.data, args.trainer)


@pytest.mark.parametrize("fields", CONFIGS)
def test_a_real_config_a_dict_and_the_stand_in_convert_alike(fields):
    # bf16/use_cpu/output_dir: the CPU settings trl_config gives every real config, given to all three
    fields = {"bf16": False, "use_cpu": True, "output_dir": "unused", **fields}
    real = compat.from_grpo_config(trl_config(**fields))
    assert comparable(real) == comparable(compat.from_grpo_config(dict(fields)))
    assert comparable(real) == comparable(compat.from_grpo_config(compat.GRPOConfig(**fields)))


@pytest.mark.parametrize("name, value", [("torch_compile", True), ("neftune_noise_alpha", 5.0), ("tf32", True),
                                         ("data_seed", 1), ("dataloader_drop_last", True),
                                         ("average_tokens_across_devices", False), ("optim_args", "x=1"),
                                         ("deepspeed", "ds.json"), ("resume_from_checkpoint", "ckpt")])
def test_a_refused_field_is_refused_from_a_real_config_a_dict_and_the_stand_in(name, value):
    """Before: dropped without a word from a real config, "unknown GRPOConfig field" from a dict."""
    hint = REFUSED[name][1]
    for config in ({name: value}, compat.GRPOConfig(**{name: value})):
        with pytest.raises(ValueError, match=rf"{name}={value!r}: .*"):
            compat.from_grpo_config(config)
    # deepspeed / resume_from_checkpoint make transformers read a file at __post_init__, tf32 wants a GPU there
    if name not in ("deepspeed", "resume_from_checkpoint", "tf32"):
        with pytest.raises(ValueError, match=hint[:20].replace("(", r"\(")):
            compat.from_grpo_config(trl_config(**{name: value}))


@pytest.mark.parametrize("name", sorted(REMOVED))
def test_fields_older_trl_had_are_refused_with_what_to_use(name):
    with pytest.raises(ValueError, match=f"{name}: not a field of TRL 1.16's GRPOConfig; "):
        compat.from_grpo_config({name: 1})


def test_a_field_no_table_knows_is_refused_from_a_real_config_unless_at_its_default():
    @dataclasses.dataclass
    class NewerGRPOConfig:  # a future TRL's field
        beta: float = 0.0
        brand_new_knob: int = 0

    compat.from_grpo_config(NewerGRPOConfig())
    with pytest.raises(ValueError, match=r"\['brand_new_knob=3'\] are not known"):
        compat.from_grpo_config(NewerGRPOConfig(brand_new_knob=3))
