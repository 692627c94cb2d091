"""vLLM's context for episodes (`rollout.context.context_length`): with tools, an environment
or a rollout_func an episode holds the prompt, every turn and every tool/environment message,
which ``max_new_tokens`` (model tokens only) does not bound, so vLLM gets the model's whole
context unless told otherwise; a given engine or server must still hold prompt + completion."""
from __future__ import annotations

import pytest

import agent_task as at
from episode_fixtures import tool_model_dir, tool_script  # noqa: F401 (fixtures)
from lightning_rlpt import RLModule
from lightning_rlpt.rollout.context import context_length, model_config


def module(path, tok, **kwargs):
    return RLModule(path, reward_funcs=[lambda completions, **_: [0.0] * len(completions)], tokenizer=tok,
                    generation=dict(max_new_tokens=16, max_prompt_length=600), **kwargs)


def test_episodes_get_the_whole_context_and_plain_rollouts_prompt_plus_completion(tool_model_dir, tool_script):
    tok = tool_script[0]
    tools, plain = module(tool_model_dir, tok, tools=[at.multiply]), module(tool_model_dir, tok)
    config = model_config(tools.policy)
    assert config.max_position_embeddings == 1024
    assert context_length(tools, None, None, config) == 1024  # the HF engine's bound too
    assert context_length(plain, None, None, config) == 600 + 16
    assert context_length(tools, None, None, config, minimum=True) == 616  # what a given engine must hold
    assert context_length(tools, 700, None, config) == 700  # the caller's choice: longer episodes truncate, flagged
    assert context_length(module(tool_model_dir, tok, environment=at.CountdownEnv), None, None, config) == 1024
    with pytest.raises(ValueError, match=r"max_model_len=610 is shorter than max_prompt_length \(600\) \+ max_new_tokens"):
        context_length(tools, 610, None, config)


def test_episodes_on_a_model_shorter_than_prompt_plus_completion(tool_model_dir, tool_script):
    tools = module(tool_model_dir, tool_script[0], tools=[at.multiply])
    config = model_config(tools.policy)
    config.max_position_embeddings = 500
    with pytest.raises(ValueError, match=r"max_position_embeddings=500\) is shorter than max_prompt_length 600"):
        context_length(tools, None, None, config)


@pytest.mark.parametrize("callback", ["VLLMRollout", "VLLMServerRollout"])
def test_a_per_turn_max_tokens_override_is_refused_with_episodes_before_any_engine_starts(tool_model_dir, tool_script,
                                                                                           callback):
    """``max_tokens=`` would replace each turn's limit inside an episode (past its model-token budget):
    refused at setup, naming the RLModule setting to use, before vLLM or a server is started; plain
    rollouts keep the override."""
    import lightning as L

    from lightning_rlpt import callbacks

    tools = module(tool_model_dir, tool_script[0], tools=[at.multiply])
    kwargs = dict(launch=dict(num_servers=1)) if callback == "VLLMServerRollout" else {}
    cb = getattr(callbacks, callback)(max_tokens=8, **kwargs)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=rf"{callback}\(max_tokens=8\) cannot be used with multi-turn episodes.*"
                                         r"RLModule\(generation=dict\(max_new_tokens=8\)\) instead"):
        cb.setup(trainer, tools, "fit")
    assert cb.engine is None and tools.rollout_engine is None  # nothing was started or installed
    cb._refuse_turn_budget_override(module(tool_model_dir, tool_script[0]))  # plain rollouts: allowed
