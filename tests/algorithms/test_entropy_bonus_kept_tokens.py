"""The entropy bonus with ``top_entropy_quantile`` < 1 is the mean over the kept tokens of the whole
mini-batch (TRL 1.16's ``mask * entropy_mask`` normaliser): micro-batches take that count from the
entropy pre-pass, so their gradient is the one-pass gradient."""
import torch
from lightning.pytorch import Callback

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule


class FirstGradient(Callback):
    def __init__(self):
        self.grads = None

    def on_before_optimizer_step(self, trainer, module, optimizer):
        if self.grads is None:
            self.grads = [p.grad.detach().clone() for p in module.policy.parameters() if p.grad is not None]


def first_gradient(model_dir, rows, **kwargs):
    module = RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, seed=5, seed_per_prompt=True,
                      max_grad_norm=None, entropy_coef=0.05, top_entropy_quantile=0.4,
                      generation=dict(max_new_tokens=4, max_prompt_length=8), **kwargs)
    seen = FirstGradient()
    quiet_trainer(max_steps=1, callbacks=[seen]).fit(module, datamodule=PromptDataModule(rows, batch_size=2))
    return seen.grads


def test_micro_batched_bonus_gradient_equals_one_pass(warm_start_dir, arithmetic_rows):
    one, micro = first_gradient(warm_start_dir, arithmetic_rows[:2]), first_gradient(warm_start_dir, arithmetic_rows[:2],
                                                                                      micro_batch_size=3)
    assert len(one) == len(micro) > 0
    for a, b in zip(one, micro):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
