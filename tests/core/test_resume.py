"""A run stopped and resumed from its checkpoint continues exactly as if it had not stopped:
same logged metrics at every step, same weights (fp32)."""
import pytest

import tiny_task as task
from lightning_rlpt import PromptDataModule, RLModule
from resume_utils import assert_same_run, straight_and_resumed


@pytest.mark.parametrize("settings", [
    dict(objective="grpo", kl_coef=0.05, updates_per_rollout=2, minibatch_size=4),
    dict(objective="dapo", lora=dict(r=4, lora_alpha=8)),
], ids=["full-mu2-minibatches", "lora-dapo"])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, warm_start_dir, arithmetic_rows, settings):
    def make_module():
        return RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, seed=5,
                        generation=dict(max_new_tokens=4, max_prompt_length=8), **settings)

    def make_data():
        return PromptDataModule(arithmetic_rows, batch_size=2, seed=7)

    straight, resumed = straight_and_resumed(tmp_path, make_module, make_data, n=4)
    assert len(straight[0]) >= 2
    assert_same_run(straight, resumed)
