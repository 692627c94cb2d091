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
from lightning_rlpt.compat.trl import from_grpo_config
from lightning_rlpt.optim.schedules import WarmupCosineLR

# A GRPOConfig of the kind TRL's docs show, every mapped knob away from its default.
FIELDS = dict(learning_rate=1e-5, weight_decay=0.1, adam_beta1=0.8, adam_beta2=0.99, max_grad_norm=0.5, seed=7,
              per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
              num_generations=4, num_generations_eval=2, num_iterations=2, beta=0.04, epsilon=0.1,
              epsilon_high=0.28, loss_type="grpo", scale_rewards="none", importance_sampling_level="token",
              use_bias_correction_kl=True, max_completion_length=16, max_prompt_length=32, temperature=0.9,
              top_p=0.95, top_k=5, min_p=0.05, repetition_penalty=1.1, chat_template_kwargs={"x": 1},
              reward_weights=[1.0, 0.5], mask_truncated_completions=True, disable_dropout=True,
              top_entropy_quantile=0.2, gradient_checkpointing=False, shuffle_dataset=False,
              vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=5.0,
              max_steps=40, logging_steps=5, bf16=False, fp16=False, lr_scheduler_type="cosine", warmup_steps=4,
              output_dir="runs/trl")

MODULE = dict(objective="grpo", group_size=4, kl_coef=0.04, kl_estimator="k1", advantage="dr_grpo",
              advantage_kwargs={}, loss_aggregation="seq-mean-token-mean", policy_loss="ppo_clip", clip_low=0.1,
              clip_high=0.28, lr=1e-5, max_grad_norm=0.5, seed=7, updates_per_rollout=2, micro_batch_size=4,
              minibatch_size=8, disable_dropout=True, mask_truncated_completions=True, top_entropy_quantile=0.2,
              gradient_checkpointing=False, rollout_correction="token_tis", rollout_correction_cap=5.0,
              weight_decay=0.1, betas=(0.8, 0.99), reward_weights=[1.0, 0.5], val_samples=2,
              generation=dict(max_new_tokens=16, temperature=0.9, top_p=0.95, top_k=5, min_p=0.05,
                              repetition_penalty=1.1, max_prompt_length=32, chat_template_kwargs={"x": 1}))


def test_every_knob_maps_by_hand():
    args = from_grpo_config(FIELDS)
    scheduler = args.module.pop("lr_scheduler")
    assert args.module == MODULE
    assert (scheduler.func, scheduler.keywords) == (WarmupCosineLR, dict(total_steps=40, warmup_steps=4))
    # 4 completions × 4 steps per generation = 16 completions = 4 prompts of 4; 2 × 4 per optimizer step
    assert args.data == dict(batch_size=4, shuffle=False, seed=7)
    assert args.trainer == dict(max_steps=40, log_every_n_steps=5)


def test_trl_defaults_are_trl_behaviour_not_ours():
    args = from_grpo_config({})
    m = args.module
    assert (m["kl_coef"], m["loss_aggregation"], m["disable_dropout"], m["generation"]["max_prompt_length"]) == (
        0.0, "token-mean", False, None)  # β 0, dapo = token-mean, dropout kept, no truncation
    assert (m["kl_estimator"], m["advantage"], m["advantage_kwargs"], m["clip_high"]) == ("k3", "grpo", {"eps": 1e-4}, 0.2)
    assert (m["rollout_correction"], m["rollout_correction_cap"], m["minibatch_size"]) == ("seq_mis", 3.0, None)
    assert "lr_scheduler" not in m  # TRL's default linear decay is not honoured (docs/from_trl.md)
    assert args.data["batch_size"] == 1  # 8 completions per rank = one group of 8
    assert args.trainer == dict(max_epochs=3, log_every_n_steps=10, precision="bf16-mixed")


def test_cispo_epsilon_high_is_the_absolute_cap():
    args = from_grpo_config(dict(loss_type="cispo", epsilon_high=5.0))
    assert (args.module["policy_loss"], args.module["clip_high"], args.module["loss_aggregation"]) == (
        "cispo", 4.0, "token-mean")
    assert from_grpo_config(dict(importance_sampling_level="sequence", epsilon=3e-4,
                                 epsilon_high=4e-4)).module["policy_loss"] == "gspo"


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
    assert from_grpo_config(GRPOConfigLike()) == from_grpo_config(as_dict)
    assert from_grpo_config(SimpleNamespace(**FIELDS)).module["generation"] == MODULE["generation"]


@pytest.mark.parametrize("field, value", [
    ("use_vllm", True), ("entropy_coef", 0.01), ("delta", 1.5), ("generation_kwargs", {"num_beams": 2}),
    ("sync_ref_model", True), ("multi_objective_aggregation", "normalize_then_sum"), ("optim", "sgd"),
    ("loss_type", "sapo"), ("loss_type", "bnpo"), ("scale_rewards", "batch"), ("lr_scheduler_type", "polynomial"),
    ("num_generations", 3), ("num_train_epochs", 1.5), ("generation_batch_size", 64)])
def test_each_refusal_names_the_field(field, value):
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        from_grpo_config({field: value})
    from_grpo_config({field: {"use_vllm": False, "entropy_coef": 0.0, "delta": None, "generation_kwargs": None,
                              "sync_ref_model": False, "multi_objective_aggregation": "sum_then_normalize",
                              "optim": "adamw_torch", "loss_type": "dapo", "scale_rewards": "group",
                              "lr_scheduler_type": "linear", "num_generations": 8, "num_train_epochs": 3.0,
                              "generation_batch_size": None}[field]})  # at TRL's default: silently fine


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
                                 max_prompt_length=8, learning_rate=1e-3, max_steps=2, logging_steps=1,
                                 bf16=False, gradient_checkpointing=False, mask_truncated_completions=True))
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], **args.module)
    before = [p.detach().clone() for p in module.policy.parameters()]
    trainer = quiet_trainer(**args.trainer)
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, **args.data))
    assert trainer.global_step == 2 and module.reference is not None  # β 0.04 builds the reference
    assert any(not torch.equal(b, a) for b, a in zip(before, module.policy.parameters()))
