"""`RLModule`'s argument groups (`lightning_rlpt.options`) build the module the flat names build,
record the flat names (hyper-parameters, the loggers' copy, a rebuild from them), cover every
argument but the few that stand alone, and refuse a setting given twice with two values."""
import dataclasses
import inspect

import pytest

import tiny_task as task
from lightning_rlpt import RLModule
from lightning_rlpt.options import (GROUPS, AgentOptions, CheckpointOptions, LoadingOptions, MemoryOptions,
                                    ObjectiveOptions, OptimizationOptions, RewardOptions, ValidationOptions)

GEN = dict(max_new_tokens=4, max_prompt_length=8)
STANDALONE = {"model", "reward_funcs", "group_size", "generation", "seed", "seed_per_prompt", "rollout_logprobs",
              "parity_every", "parity_threshold"}  # the arguments no group holds
FLAT = dict(objective="dapo", kl_coef=0.1, clip_high=0.3, entropy_coef=0.01, rollout_correction="seq_tis",
            disable_dropout=False, reward_weights=[2.0], reward_on_error="zero", success_threshold=0.5,
            micro_batch_size=2, head_gradient="recompute", updates_per_rollout=2, minibatch_size=4, lr=2e-6,
            max_grad_norm=0.5, val_generation={**GEN, "temperature": 0.8}, val_samples=2, val_pass_k=[1, 2],
            max_turns=3, tool_timeout=5.0,
            resume_overrides=["kl_coef"], checkpoint_checksums=False)
GROUPED = dict(objective=ObjectiveOptions("dapo", kl_coef=0.1, clip_high=0.3, entropy_coef=0.01,
                                          rollout_correction="seq_tis"),
               loading=LoadingOptions(disable_dropout=False),
               rewards=RewardOptions(reward_weights=[2.0], reward_on_error="zero", success_threshold=0.5),
               memory=MemoryOptions(micro_batch_size=2, head_gradient="recompute"),
               optimization=OptimizationOptions(updates_per_rollout=2, minibatch_size=4, lr=2e-6, max_grad_norm=0.5),
               validation=ValidationOptions(val_generation={**GEN, "temperature": 0.8}, val_samples=2,
                                            val_pass_k=[1, 2]),
               agent=AgentOptions(max_turns=3, tool_timeout=5.0),
               checkpointing=CheckpointOptions(resume_overrides=["kl_coef"], checkpoint_checksums=False))


def make(path, **kw):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, generation=GEN, **kw)


def _built(module):
    """What the constructor built from the settings, beside the hyper-parameters."""
    return dict(objective=module.objective, knobs=(module.knobs.kl_coef, module.knobs.clip_high),
                micro=module.micro_batching.micro_batch_size, head=module.head_in_forward.mode,
                reference=module.use_reference, weights=module.rewards.weights.tolist(),
                turns=module.agent.max_turns, val=sorted(module.val_pass))


def test_the_groups_build_what_the_flat_names_build_and_record_the_flat_names(warm_start_dir):
    flat, grouped = make(warm_start_dir, **FLAT), make(warm_start_dir, **GROUPED)
    assert dict(grouped.hparams) == dict(flat.hparams)
    assert dict(grouped.hparams_initial) == dict(flat.hparams_initial)  # what the loggers log
    assert not set(GROUPS) - {"objective"} & set(grouped.hparams) and grouped.hparams.objective == "dapo"
    assert _built(grouped) == _built(flat)
    assert _built(flat) != _built(make(warm_start_dir))  # the settings above are not the defaults
    rebuilt = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], **grouped.hparams)  # a checkpoint's or CLI's
    assert dict(rebuilt.hparams) == dict(flat.hparams)


def test_every_argument_but_the_standalone_ones_is_in_exactly_one_group():
    params = set(inspect.signature(RLModule.__init__).parameters) - {"self"} - set(GROUPS)
    fields = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(fields) == len(set(fields))
    assert set(fields) | STANDALONE | {"objective"} == params | {"objective"}
    assert not set(fields) & STANDALONE


def test_a_setting_given_flat_and_grouped_must_agree(warm_start_dir):
    with pytest.raises(ValueError, match=r"micro_batch_size is given twice, 2 flat and 4 in memory=MemoryOptions"):
        make(warm_start_dir, micro_batch_size=2, memory=MemoryOptions(micro_batch_size=4))
    agreed = make(warm_start_dir, micro_batch_size=2, memory=MemoryOptions(micro_batch_size=2, padding_free=False))
    assert agreed.hparams.micro_batch_size == 2
    with pytest.raises(ValueError, match="clip_high is given twice"):
        make(warm_start_dir, clip_high=0.3, objective=ObjectiveOptions(clip_high=0.28))


def test_an_objective_group_without_a_preset_takes_the_default_preset(warm_start_dir):
    module = make(warm_start_dir, objective=ObjectiveOptions(kl_coef=0.2))
    assert module.hparams.objective == "grpo" and module.knobs.kl_coef == 0.2 and module.use_reference


def test_a_group_keyword_refuses_anything_but_its_group_and_groups_refuse_trl_names(warm_start_dir):
    with pytest.raises(TypeError, match=r"memory= takes a MemoryOptions \(lightning_rlpt.options\), got dict"):
        make(warm_start_dir, memory=dict(micro_batch_size=2))
    wrong = r"objective= takes an ObjectiveOptions or a preset name \(lightning_rlpt.options\), got MemoryOptions"
    with pytest.raises(TypeError, match=wrong):
        make(warm_start_dir, objective=MemoryOptions())
    with pytest.raises(TypeError, match="`beta`, which is TRL's name; use `kl_coef`"):
        ObjectiveOptions(beta=0.04)
    with pytest.raises(TypeError, match="unexpected keyword argument 'kl_coef'"):
        MemoryOptions(kl_coef=0.1)  # a setting in the wrong group: Python's own message names it


def test_a_subclass_keeps_its_own_arguments_in_the_hyper_parameters(warm_start_dir):
    class Mine(RLModule):
        def __init__(self, path, extra: int = 0, **kwargs):
            super().__init__(path, reward_funcs=[task.exact_answer], group_size=4, generation=GEN, **kwargs)

    module = Mine(warm_start_dir, extra=3, memory=MemoryOptions(micro_batch_size=2))
    assert module.hparams.extra == 3 and module.hparams.micro_batch_size == 2 and "memory" not in module.hparams
