"""A real fit on multi-turn episodes: RLModule(environment=...) trains a few steps on the HF
engine, rewards see the whole episode as messages and the environment's reward column, and the
episode metrics are logged with the values the episodes imply."""
from __future__ import annotations

import lightning as L

import agent_task as at
from episode_fixtures import tok, env_model_dir  # noqa: F401 (fixtures)
from lightning_rlpt import PromptDataModule, RLModule


def test_fit_with_an_environment_logs_episode_metrics(env_model_dir, tok):
    seen = []

    def env_reward(prompts, completions, env_reward, completion_messages, **_):
        seen.append((completions, completion_messages, env_reward))
        return [r or 0.0 for r in env_reward]

    module = RLModule(env_model_dir, reward_funcs=[env_reward], tokenizer=tok, group_size=2, kl_coef=0.0,
                      environment=at.CountdownEnv, max_turns=3, generation={"max_new_tokens": 24, "temperature": 1.0})
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, max_steps=2,
                        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0)
    rows = [{"prompt": [{"role": "user", "content": "env"}]}] * 4
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2))
    assert trainer.global_step == 2 and len(seen) == 2
    completions, messages, rewards = seen[-1]
    assert completions == messages and all(m[0]["role"] == "assistant" for m in messages)
    metrics = {k: float(v) for k, v in trainer.logged_metrics.items()}
    turns = [sum(m["role"] == "assistant" for m in row) for row in messages]
    assert metrics["turns/mean"] == sum(turns) / len(turns) and metrics["turns/max"] == max(turns)
    assert metrics["tools/call_frequency"] == 0.0 and 0 < metrics["completions/model_token_fraction"] <= 1
    assert metrics["reward"] == sum(r or 0.0 for r in rewards) / len(rewards)
