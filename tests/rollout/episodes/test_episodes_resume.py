"""Exact resume mid-run with tools and an environment: a run stopped at step 2 and resumed from
its checkpoint logs the same metrics (episode metrics included) and ends with the same weights
as an uninterrupted one. Episodes are a function of the checkpointed seed stream (`turn_seed`),
environments are fresh per episode, tools are stateless: nothing else needs saving."""
from __future__ import annotations

import pytest

import agent_task as at
from episode_fixtures import tok, env_model_dir  # noqa: F401 (fixtures)
from lightning_rlpt import PromptDataModule, RLModule
from resume_utils import assert_same_run, straight_and_resumed


@pytest.mark.slow
def test_resume_with_tools_and_an_environment(tmp_path, env_model_dir, tok):
    def reward(completions, env_reward, **_):
        return [r or 0.0 for r in env_reward]

    def make_module():
        return RLModule(env_model_dir, reward_funcs=[reward], tokenizer=at.build_tokenizer(), group_size=2,
                        lr=1e-3, seed=5, kl_coef=0.0, tools=[at.multiply], environment=at.CountdownEnv, max_turns=3,
                        generation={"max_new_tokens": 16, "temperature": 1.0})

    def make_data():
        # 12 rows in batches of 2: the checkpoint at step 2 falls mid-epoch, as in tests/core/test_resume.py.
        rows = [{"prompt": [{"role": "user", "content": p}]} for p in ("env", "3*4", "div", "envx") * 3]
        return PromptDataModule(rows, batch_size=2, seed=7)

    straight, resumed = straight_and_resumed(tmp_path, make_module, make_data, n=2)
    assert len(straight[0]) >= 2 and any("turns/mean" in row for row in straight[0].values())
    assert_same_run(straight, resumed)
