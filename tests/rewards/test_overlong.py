"""DAPO's overlong handling with TRL's names: the soft overlong punishment reward and
``mask_truncated_completions``."""
import pytest
import torch
from dataclasses import replace

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule, soft_overlong_punishment


def test_soft_overlong_punishment_by_hand():
    punish = soft_overlong_punishment(max_completion_len=20, soft_punish_cache=8)  # ramp over 13..20
    lengths = [0, 12, 13, 16, 20, 21, 40]
    got = punish(["q"] * 7, [""] * 7, completion_ids=[[5] * n for n in lengths])
    assert got == pytest.approx([0.0, 0.0, -1 / 8, -4 / 8, -1.0, -1.0, -1.0])
    assert soft_overlong_punishment(4, 0)(["q"] * 2, ["", ""], completion_ids=[[1] * 4, [1] * 5]) == [0.0, -1.0]
    assert punish.__name__ == "overlong"


@pytest.mark.parametrize("args", [(0, 0), (10, 11), (10, -1)])
def test_soft_overlong_punishment_bad_arguments(args):
    with pytest.raises(ValueError, match="0 <= soft_punish_cache <= max_completion_len"):
        soft_overlong_punishment(*args)


def test_overlong_reward_logged_beside_the_task_reward(warm_start_dir, arithmetic_rows):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer, soft_overlong_punishment(4, 2)], group_size=2,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    assert "rewards/overlong/mean" in trainer.callback_metrics
    assert trainer.callback_metrics["rewards/overlong/mean"] <= 0


def test_mask_truncated_completions_is_the_loss_without_those_rows(llama_dir, arithmetic_rows):
    """The masked loss equals the plain loss on the same batch with the truncated rows' masks zeroed,
    and differs from the plain loss when some rows are truncated."""
    batches = []

    class Keep(RLCallback):
        def on_before_loss(self, trainer, module, minibatch):
            batches.append(minibatch)

    gen = dict(max_new_tokens=4, max_prompt_length=8)  # a random model ends ~1 in 4 completions within 4 tokens
    module = RLModule(llama_dir, reward_funcs=[task.exact_answer], group_size=4, generation=gen, kl_coef=0.0,
                      loss_aggregation="token-mean", mask_truncated_completions=True, seed=3)
    quiet_trainer(max_steps=1, callbacks=[Keep()]).fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    mb = batches[0]
    truncated = mb.truncated.bool()
    assert 0 < truncated.sum() < len(mb), "need both kinds of rows"
    mb.advantages = torch.linspace(-1, 1, len(mb))  # non-zero advantages everywhere
    masked, _ = module.loss(mb)
    zeroed = replace(mb, completion_mask=mb.completion_mask * (~truncated).unsqueeze(-1))
    module.hparams.mask_truncated_completions = False
    by_hand, _ = module.loss(zeroed)
    plain, _ = module.loss(mb)
    assert masked.item() == pytest.approx(by_hand.item(), abs=1e-7)
    assert abs(masked.item() - plain.item()) > 1e-4
