"""`run_episodes` / `rollout_episodes` on the HF engine with a model that replays a script:
turns, masks, budgets, the context limit and the environment's checks, worked out by hand."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import agent_task as at
from episode_fixtures import tok, env_model_dir  # noqa: F401 (fixtures)
from lightning_rlpt.rollout.episodes.agent import Agent, info_metrics
from lightning_rlpt.rollout.episodes.rollout import rollout_episodes
from lightning_rlpt.rollout.hf import HFGenerateEngine
from lightning_rlpt.rollout.sampling import SamplingConfig

ENV_PROMPT = [{"role": "user", "content": "env"}]


def run(model_dir, tok, env=at.CountdownEnv, group=2, max_new_tokens=40, max_context=None, **agent):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFGenerateEngine(model, tok.eos_token_id, tok.pad_token_id, return_logprobs=True)
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    return rollout_episodes(Agent(environment=env, **agent), engine, tok, {"prompt": [ENV_PROMPT]}, group,
                            sampling, 0, torch.device("cpu"), max_context=max_context)[0]


def test_environment_episode_masks_and_metrics(env_model_dir, tok):
    exp = run(env_model_dir, tok)
    obs = ["left: 2", "left: 1"]
    assert exp.columns["completion_messages"][0] == [
        {"role": "assistant", "content": "a7"}, {"role": "user", "content": obs[0]},
        {"role": "assistant", "content": "b"}, {"role": "user", "content": obs[1]},
        {"role": "assistant", "content": "c7"}]
    # Tokens by hand: model "a7</s>" (3), env "<s>user\nleft: 2</s><s>assistant\n" (1+5+7+1+1+10 = 25),
    # model "b</s>" (2), env 25, model "c7</s>" (3).
    mask = [1] * 3 + [0] * 25 + [1] * 2 + [0] * 25 + [1] * 3
    assert exp.completion_mask[0].tolist() == mask and exp.completion_mask[1].tolist() == mask
    ids = exp.completion_ids[0].tolist()
    assert tok.decode(ids[3:28]) == "<s>user\nleft: 2</s><s>assistant\n"
    assert exp.columns["env_reward"] == [2.0, 2.0]  # "a7" and "c7" contain a 7
    assert exp.truncated.tolist() == [False, False]
    assert (exp.behaviour_logprobs[0][torch.tensor(mask) == 0] == 0).all()
    assert exp.completions[0] == "a7user\nleft: 2assistant\nbuser\nleft: 1assistant\nc7"
    metrics = info_metrics(exp.info, exp.completion_mask.sum(1))
    assert metrics == {"tools/call_frequency": 0.0, "tools/failure_frequency": 0.0, "tools/truncation_frequency": 0.0,
                       "turns/mean": 3.0, "turns/max": 3.0, "completions/model_token_fraction": 8 / 58}


def test_model_token_budget_counts_only_model_tokens(env_model_dir, tok):
    """8 model tokens in all: a budget of 8 finishes the 58-token episode; 7 cuts the last turn."""
    full = run(env_model_dir, tok, max_new_tokens=8, group=1)
    assert full.truncated.tolist() == [False] and int(full.completion_mask.sum()) == 8
    cut = run(env_model_dir, tok, max_new_tokens=7, group=1)
    assert cut.truncated.tolist() == [True] and int(cut.completion_mask.sum()) == 7
    assert cut.info["turns"].tolist() == [3]


def test_context_overflow_truncates_and_flags(env_model_dir, tok):
    """The prompt is 37 tokens ("<s>user\\nenv</s>" 10 + "<s>user\\nstart env</s>" 16 +
    "<s>assistant\\n" 11). A context of 37 + 3 + 25 leaves no room for a second answer: the
    episode ends before the observation, flagged; 37 + 2 cuts the first turn itself."""
    assert len(tok.apply_chat_template(ENV_PROMPT + [{"role": "user", "content": "start env"}],
                                       add_generation_prompt=True, tokenize=True)["input_ids"]) == 37
    exp = run(env_model_dir, tok, max_context=37 + 3 + 25, group=1)
    assert exp.truncated.tolist() == [True] and exp.completion_mask[0].tolist() == [1, 1, 1]
    assert exp.columns["completion_messages"][0] == [{"role": "assistant", "content": "a7"}]
    short = run(env_model_dir, tok, max_context=37 + 2, group=1)
    assert short.truncated.tolist() == [True] and short.completion_ids.shape[1] == 2
    roomy = run(env_model_dir, tok, max_context=37 + 3 + 25 + 1, group=1)  # one token of room: the turn starts
    assert roomy.info["turns"].tolist() == [2] and roomy.truncated.tolist() == [True]


class WrongRewardEnv(at.CountdownEnv):
    def step(self, text):
        return "more", "1.0", False


class NotATupleEnv(at.CountdownEnv):
    def step(self, text):
        return "more"


class BadResetEnv(at.CountdownEnv):
    def reset(self, row):
        return {"obs": 1}


def test_environment_wrong_types_raise_naming_the_method(env_model_dir, tok):
    with pytest.raises(TypeError, match=r"WrongRewardEnv\.step must return \(observation: str \| None, reward: float \| None, done: bool\); reward is str"):
        run(env_model_dir, tok, env=WrongRewardEnv, group=1)
    with pytest.raises(TypeError, match=r"NotATupleEnv\.step must return \(observation.*got str"):
        run(env_model_dir, tok, env=NotATupleEnv, group=1)
    with pytest.raises(TypeError, match=r"BadResetEnv\.reset must return a str \(the first observation"):
        run(env_model_dir, tok, env=BadResetEnv, group=1)


def test_agent_arguments_refused():
    with pytest.raises(ValueError, match="max_turns must be an int >= 1"):
        Agent(max_turns=0)
    with pytest.raises(TypeError, match="environment must be a class or a zero-argument callable"):
        Agent(environment=at.CountdownEnv())
    assert not Agent().active and Agent(max_turns=2).active and Agent(environment=at.CountdownEnv).max_turns == 10


def test_rollout_func_replaces_the_loop(env_model_dir, tok):
    from lightning_rlpt.rollout.episodes import Episode

    def scripted(prompts, engine, tokenizer, sampling, seeds):
        return [Episode([5, 6, 2], [1, 0, 1], [0.0] * 3, turns=2, tool_calls=1) for _ in prompts]

    exp = run(env_model_dir, tok, env=None, rollout_func=scripted)
    assert exp.completion_mask.tolist() == [[1, 0, 1]] * 2 and exp.info["tool_calls"].tolist() == [1, 1]
    with pytest.raises(TypeError, match=r"rollout_func must return one Episode per prompt row \(2\)"):
        run(env_model_dir, tok, env=None, rollout_func=lambda *a: ["x"])

