"""`lightning_rlpt.compat.trl`: a TRL ``GRPOConfig`` (dict or object) converted knob by knob,
its unhonourable fields refused by name, and TRL's names refused by `RLModule` with the equivalent."""
import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.compat.trl import GRPOConfig, from_grpo_config
from lightning_rlpt.optim.schedules import WarmupCosineLR, WarmupLinearLR

# A GRPOConfig of the kind TRL's docs show, every mapped knob away from its default.
FIELDS = dict(learning_rate=1e-5, weight_decay=0.1, adam_beta1=0.8, adam_beta2=0.99, max_grad_norm=0.5, seed=7,
              per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
              num_generations=4, num_generations_eval=2, num_iterations=2, beta=0.04, epsilon=0.1,
              epsilon_high=0.28, loss_type="grpo", scale_rewards="none", importance_sampling_level="token",
              use_bias_correction_kl=True, max_completion_length=16, temperature=0.9,
              top_p=0.95, top_k=5, min_p=0.05, repetition_penalty=1.1, chat_template_kwargs={"x": 1},
              reward_weights=[1.0, 0.5], mask_truncated_completions=True, disable_dropout=True,
              top_entropy_quantile=0.2, gradient_checkpointing=False, shuffle_dataset=False,
              vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=5.0,
              max_steps=40, logging_steps=5, bf16=False, fp16=False, lr_scheduler_type="cosine", warmup_steps=4,
              output_dir="runs/trl", entropy_coef=0.01, generation_kwargs={"no_repeat_ngram_size": 3})

MODULE = dict(objective="grpo", group_size=4, kl_coef=0.04, kl_estimator="k3_ratio", advantage="dr_grpo",
              advantage_kwargs={}, loss_aggregation="seq-mean-token-mean", policy_loss="ppo_clip", clip_low=0.1,
              clip_high=0.28, lr=1e-5, max_grad_norm=0.5, seed=7, updates_per_rollout=2, micro_batch_size=4,
              minibatch_size=8, disable_dropout=True, mask_truncated_completions=True, top_entropy_quantile=0.2,
              gradient_checkpointing=False, rollout_correction="token_tis", rollout_correction_cap=5.0,
              weight_decay=0.1, betas=(0.8, 0.99), reward_weights=[1.0, 0.5], val_samples=2, entropy_coef=0.01,
              multi_objective_aggregation="sum_then_normalize",
              generation=dict(max_new_tokens=16, temperature=0.9, top_p=0.95, top_k=5, min_p=0.05,
                              repetition_penalty=1.1, max_prompt_length=None, chat_template_kwargs={"x": 1},
                              generation_kwargs={"no_repeat_ngram_size": 3}))


def _comparable(args):
    """The args with the schedule's partial as (class, keywords): partials compare by identity."""
    schedule = args.module.get("lr_scheduler")
    module = {**args.module, "lr_scheduler": (schedule.func, schedule.keywords) if schedule else None}
    return module, args.data, args.trainer


def test_every_knob_maps_by_hand():
    args = from_grpo_config(FIELDS)
    scheduler = args.module.pop("lr_scheduler")
    assert args.module == MODULE
    assert (scheduler.func, scheduler.keywords) == (WarmupCosineLR, dict(warmup_steps=4))  # length: the run's
    # 4 completions × 4 steps per generation = 16 completions = 4 prompts of 4; 2 × 4 per optimizer step
    assert args.data == dict(batch_size=4, shuffle=False, seed=7)
    assert args.trainer == dict(max_steps=40, log_every_n_steps=5, default_root_dir="runs/trl")


def test_trl_defaults_are_trl_behaviour_not_ours():
    args = from_grpo_config({})
    m = args.module
    assert (m["kl_coef"], m["loss_aggregation"], m["disable_dropout"], m["generation"]["max_prompt_length"]) == (
        0.0, "token-mean", False, None)  # β 0, dapo = token-mean, dropout kept, no truncation
    assert (m["kl_estimator"], m["advantage"], m["advantage_kwargs"], m["clip_high"]) == ("k3_ratio", "grpo", {"eps": 1e-4}, 0.2)  # TRL 1.16: bias-corrected KL
    assert (m["rollout_correction"], m["rollout_correction_cap"], m["minibatch_size"]) == ("seq_mis", 3.0, None)
    assert (m["entropy_coef"], m["multi_objective_aggregation"]) == (0.0, "sum_then_normalize")
    assert (m["lr_scheduler"].func, m["lr_scheduler"].keywords) == (WarmupLinearLR, dict(warmup_steps=0.0))
    assert args.data["batch_size"] == 1  # 8 completions per rank = one group of 8
    assert args.trainer == dict(max_epochs=3, log_every_n_steps=10, precision="bf16-mixed")


def test_cispo_epsilon_high_is_the_absolute_cap():
    args = from_grpo_config(dict(loss_type="cispo", epsilon_high=5.0))
    assert (args.module["policy_loss"], args.module["clip_high"], args.module["loss_aggregation"]) == (
        "cispo", 4.0, "token-mean")
    assert from_grpo_config(dict(importance_sampling_level="sequence", epsilon=3e-4,
                                 epsilon_high=4e-4)).module["policy_loss"] == "gspo"


@pytest.mark.parametrize("fields, expected", [
    # TRL GRPOTrainer._compute_loss: grpo/sapo/luspo average per sequence, dapo/cispo/vespo over the
    # global tokens, bnpo over the local tokens, dr_grpo over max_completion_length
    (dict(loss_type="bnpo"), dict(policy_loss="ppo_clip", loss_aggregation="bnpo")),
    (dict(loss_type="sapo", sapo_temperature_pos=0.9, sapo_temperature_neg=1.2),
     dict(policy_loss="sapo", loss_aggregation="seq-mean-token-mean",
          policy_loss_kwargs=dict(temperature_pos=0.9, temperature_neg=1.2))),
    (dict(loss_type="luspo", importance_sampling_level="sequence"),
     dict(policy_loss="luspo", loss_aggregation="seq-mean-token-mean")),
    (dict(loss_type="vespo", vespo_k_pos=1.5, vllm_importance_sampling_mode="token_truncate"), dict(
        policy_loss="vespo", loss_aggregation="token-mean", rollout_correction=None,  # VESPO corrects itself
        policy_loss_kwargs=dict(k_pos=1.5, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0, behaviour_cap=3.0,
                                behaviour_mode="truncate"))),
    (dict(loss_type="vespo", vllm_importance_sampling_mode="token_mask"), dict(
        policy_loss_kwargs=dict(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0, behaviour_cap=3.0,
                                behaviour_mode="mask"))),
    (dict(loss_type="vespo", vllm_importance_sampling_correction=False), dict(
        policy_loss_kwargs=dict(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0, behaviour_cap=3.0,
                                behaviour_mode=None))),
    (dict(importance_sampling_level="sequence"), dict(policy_loss="gspo", kl_estimator="k3_seq_ratio")),
    (dict(importance_sampling_level="sequence", use_bias_correction_kl=False), dict(kl_estimator="k3")),
    (dict(scale_rewards="batch"), dict(advantage="grpo_batch_std", advantage_kwargs={"eps": 1e-4})),
    (dict(scale_rewards=False), dict(advantage="dr_grpo", advantage_kwargs={})),
    # GDPO: TRL normalises the sum over the batch whatever scale_rewards says
    (dict(multi_objective_aggregation="normalize_then_sum", scale_rewards="none"),
     dict(multi_objective_aggregation="normalize_then_sum", advantage="grpo_batch_std")),
])
def test_trl_loss_types_and_scalings_map_to_ours(fields, expected):
    module = from_grpo_config(fields).module
    assert {k: module[k] for k in expected} == expected


@pytest.mark.parametrize("fields", [
    dict(loss_type="bnpo"), dict(loss_type="sapo"), dict(loss_type="luspo", importance_sampling_level="sequence"),
    dict(loss_type="vespo", vllm_importance_sampling_mode="token_mask"), dict(loss_type="cispo", epsilon_high=5.0),
    dict(scale_rewards="batch", multi_objective_aggregation="normalize_then_sum", entropy_coef=0.01,
         generation_kwargs={"no_repeat_ngram_size": 3})])
def test_each_converted_loss_type_builds_an_rlmodule(fields, warm_start_dir):
    """RLModule's own start-up checks accept what the converter makes (e.g. luspo's one aggregation,
    vespo without a rollout correction)."""
    args = from_grpo_config({"num_generations": 4, "max_completion_length": 4, "gradient_checkpointing": False,
                             **fields})
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], **args.module)
    assert module.objective.loss_aggregation == args.module["loss_aggregation"]


def test_generation_kwargs_that_override_a_sampling_field_set_it():
    """TRL lets generation_kwargs override its sampling fields; here those keys set the field and the
    rest passes through (SamplingConfig refuses a field's name inside generation_kwargs)."""
    generation = from_grpo_config(dict(temperature=0.9, generation_kwargs={
        "temperature": 0.7, "max_tokens": 9, "no_repeat_ngram_size": 3})).module["generation"]
    assert (generation["temperature"], generation["max_new_tokens"]) == (0.7, 9)
    assert generation["generation_kwargs"] == {"no_repeat_ngram_size": 3}


@pytest.mark.parametrize("fields, schedule, keywords", [
    (dict(lr_scheduler_type="cosine", warmup_steps=3), WarmupCosineLR, dict(warmup_steps=3)),
    (dict(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": 1e-7}), WarmupCosineLR,
     dict(warmup_steps=0.0, min_lr_ratio=pytest.approx(0.1))),  # min_lr / TRL's learning_rate 1e-6
])
def test_schedules_follow_the_run(fields, schedule, keywords):
    scheduler = from_grpo_config(fields).module["lr_scheduler"]
    assert (scheduler.func, scheduler.keywords) == (schedule, keywords)
    assert "lr_scheduler" not in from_grpo_config(dict(lr_scheduler_type="constant")).module


def test_a_trl_config_after_its_post_init_converts():
    """A real GRPOConfig has derived generation_batch_size (global) from steps_per_generation: that
    pair is read by steps_per_generation; generation_batch_size alone is refused (it counts all processes)."""
    args = from_grpo_config(dict(per_device_train_batch_size=4, steps_per_generation=4, generation_batch_size=32,
                                 num_generations=4, lr_scheduler_type="linear", warmup_steps=0.1))
    assert args.data["batch_size"] == 4
    assert args.module["lr_scheduler"].keywords == dict(warmup_steps=0.1)  # a fraction of the run, as transformers
    with pytest.raises(ValueError, match=r"generation_batch_size=32: give steps_per_generation instead"):
        from_grpo_config(dict(per_device_train_batch_size=4, generation_batch_size=32, num_generations=4))


def test_the_stand_in_config_takes_trls_fields_only():
    config = GRPOConfig(beta=0.04, loss_type="dr_grpo", output_dir="runs/x", report_to="tensorboard")
    assert _comparable(from_grpo_config(config)) == _comparable(
        from_grpo_config(dict(beta=0.04, loss_type="dr_grpo", output_dir="runs/x")))
    with pytest.raises(TypeError, match=r"\['num_generation'\]; num_generation: did you mean 'num_generations'"):
        GRPOConfig(num_generation=4)


@dataclass
class GRPOConfigLike:  # TRL's attribute names on a dataclass, as GRPOConfig is one
    beta: float = 0.04
    loss_type: str = "grpo"
    num_generations: int = 4
    per_device_train_batch_size: int = 4
    max_steps: int = 40
    report_to: str = "tensorboard"  # not read: an object's other attributes are ignored
    hub_strategy: str = "every_save"


def test_an_object_converts_like_its_fields():
    as_dict = dict(beta=0.04, loss_type="grpo", num_generations=4, per_device_train_batch_size=4, max_steps=40)
    assert _comparable(from_grpo_config(GRPOConfigLike())) == _comparable(from_grpo_config(as_dict))
    assert from_grpo_config(SimpleNamespace(**FIELDS)).module["generation"] == MODULE["generation"]


REFUSALS = {  # field: (a value refused, TRL's default)
    "use_vllm": (True, False), "use_adaptive_entropy": (True, False), "delta": (1.5, None),
    "sync_ref_model": (True, False), "off_policy_mask_threshold": (0.5, None), "optim": ("sgd", "adamw_torch"),
    "multi_objective_aggregation": ("max", "sum_then_normalize"), "loss_type": ("ppo", "dapo"),
    "scale_rewards": ("max", "group"), "lr_scheduler_type": ("polynomial", "linear"), "num_generations": (3, 8),
    "num_train_epochs": (1.5, 3.0), "generation_batch_size": (64, None), "importance_sampling_level": ("seq", "token"),
    "lr_scheduler_kwargs": ({"power": 2.0}, None),
}


@pytest.mark.parametrize("field", REFUSALS)
def test_each_refusal_names_the_field(field):
    value, default = REFUSALS[field]
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        from_grpo_config({field: value})
    from_grpo_config({field: default})  # at TRL's default: silently fine


@pytest.mark.parametrize("fields, level", [(dict(loss_type="luspo"), "'token' with loss_type='luspo': use 'sequence'"),
                                           (dict(loss_type="sapo", importance_sampling_level="sequence"),
                                            "'sequence' with loss_type='sapo': use 'token'")])
def test_a_loss_at_a_level_it_does_not_have_is_refused(fields, level):
    with pytest.raises(ValueError, match=re.escape(f"importance_sampling_level={level}")):
        from_grpo_config(fields)


def test_cispo_without_a_cap_and_a_typo_are_refused():
    with pytest.raises(ValueError, match=r"epsilon_high=None with loss_type='cispo'.*5\.0"):
        from_grpo_config(dict(loss_type="cispo"))
    with pytest.raises(ValueError, match=r"\['betta'\]; betta: did you mean 'beta'"):
        from_grpo_config(dict(betta=0.1))


@pytest.mark.parametrize("name, equivalent", [("beta", "kl_coef"), ("num_generations", "group_size"),
                                              ("learning_rate", "lr"), ("num_iterations", "updates_per_rollout")])
def test_rlmodule_names_the_equivalent_of_a_trl_name(name, equivalent, warm_start_dir):
    with pytest.raises(TypeError, match=rf"`{name}`, which is TRL's name; use `{equivalent}` \(see docs/from_trl.md\)"):
        RLModule(warm_start_dir, reward_funcs=[task.exact_answer], **{name: 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):  # Python's own error otherwise
        RLModule(warm_start_dir, reward_funcs=[task.exact_answer], bogus=1)


def test_converted_arguments_fit(warm_start_dir, arithmetic_rows):
    args = from_grpo_config(dict(beta=0.04, loss_type="grpo", num_generations=4, per_device_train_batch_size=4,
                                 gradient_accumulation_steps=2, steps_per_generation=2, max_completion_length=4,
                                 learning_rate=1e-3, max_steps=2, logging_steps=1,
                                 bf16=False, gradient_checkpointing=False, mask_truncated_completions=True))
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], **args.module)
    before = [p.detach().clone() for p in module.policy.parameters()]
    trainer = quiet_trainer(**args.trainer)
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, **args.data))
    assert trainer.global_step == 2 and module.reference is not None  # β 0.04 builds the reference
    assert any(not torch.equal(b, a) for b, a in zip(before, module.policy.parameters()))
