"""Prompt truncation is opt-in and loud: by default no prompt is cut (as TRL); with
``max_prompt_length`` set, the first batch with a cut prompt warns (count, limit, remedy), later
ones stay quiet while ``prompts/truncated`` keeps counting."""
import warnings

import pytest

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.rollout import SamplingConfig
from lightning_rlpt.rollout.context import context_length, model_config

LONG = {"prompt": "12+34=", "answer": "46"}  # 7 tokens with BOS


def fit(module, rows, steps):
    trainer = quiet_trainer(max_steps=steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2))
    return trainer, [str(w.message) for w in caught if "max_prompt_length" in str(w.message)]


def spy_reward(seen):
    def reward(prompts, completions, **_):
        seen.append(prompts)
        return [0.0] * len(completions)
    return reward


def test_no_prompt_is_cut_by_default(warm_start_dir):
    assert SamplingConfig().max_prompt_length is None
    seen = []
    module = RLModule(warm_start_dir, reward_funcs=[spy_reward(seen)], group_size=2,
                      generation=dict(max_new_tokens=2))
    trainer, messages = fit(module, [LONG] * 2, steps=1)
    assert messages == [] and trainer.callback_metrics["prompts/truncated"] == 0
    assert module.tokenizer.decode(module.sample({"prompt": ["12+34="]}, 1, module.sampling, 0)[0].prompt_ids[0],
                                   skip_special_tokens=True) == "12+34="


def test_first_cut_batch_warns_once_with_count_limit_and_remedy(warm_start_dir):
    module = RLModule(warm_start_dir, reward_funcs=[spy_reward([])], group_size=2,
                      generation=dict(max_new_tokens=2, max_prompt_length=3))
    trainer, messages = fit(module, [LONG, {"prompt": "1+2=", "answer": "3"}] * 2, steps=2)
    assert len(messages) == 1, messages  # two cut batches, one warning
    assert messages[0].startswith("max_prompt_length=3 cut 2 of the 2 prompts of a batch (global step 0) to "
                                  "their last 3 tokens")
    assert "generation=dict(max_prompt_length=None)" in messages[0] and "prompt_truncation='error'" in messages[0]
    assert trainer.global_step == 2 and trainer.callback_metrics["prompts/truncated"] == 2  # still counted


def test_given_vllm_engine_without_a_prompt_limit_needs_room_for_one_prompt_token(warm_start_dir):
    """No ``max_prompt_length``: a given engine must hold a one-token prompt and the longest
    completion (longer prompts are refused batch by batch), not the model's whole context."""
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2,
                      generation=dict(max_new_tokens=6))
    config = model_config(module.policy)
    assert context_length(module, None, None, config, minimum=True) == 7
    assert context_length(module, None, None, config) == config.max_position_embeddings  # the size to start with
    with pytest.raises(ValueError, match=r"max_model_len=12 is shorter than max_prompt_length \(8\)"):
        module.sampling.max_prompt_length = 8
        context_length(module, 12, None, config)
