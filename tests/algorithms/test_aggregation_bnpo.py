"""``bnpo`` aggregation (TRL's ``loss_type="bnpo"``): each rank's token mean, averaged over ranks;
by hand, against TRL's formula, and through the module, where micro-batches must not change it.

TRL's formula is transcribed from ``trl/trainer/grpo_trainer.py`` (TRL main, July 2026),
``GRPOTrainer._compute_loss``, the ``loss_type == "bnpo"`` normalisation; DDP then averages the
processes' gradients, so the optimised loss is the mean of the processes' losses.
"""
import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.algorithms.aggregation import aggregate_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [2.0, 2.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float64)
RANKS = (slice(0, 2), slice(2, 3))  # rank 0: rows 0-1 (4 tokens), rank 1: row 2 (2 tokens)


def shares(loss, mask):
    return [aggregate_loss(loss[s], mask[s], "bnpo", local_tokens=mask[s].sum().item(), num_ranks=2) for s in RANKS]


def test_by_hand():
    """Rank 0: (1+2+3+4)/4 = 2.5; rank 1: (2+2)/2 = 2; bnpo (2.5 + 2)/2 = 2.25, while the global
    token mean is 14/6. One rank alone: its token mean."""
    assert sum(s.item() for s in shares(LOSS, MASK)) == pytest.approx(2.25)
    assert aggregate_loss(LOSS, MASK, "token-mean").item() == pytest.approx(14 / 6)
    assert aggregate_loss(LOSS, MASK, "bnpo").item() == pytest.approx(14 / 6)


def test_a_rank_without_tokens_adds_nothing_and_still_counts():
    """TRL clamps the count at 1: a rank whose tokens are all masked contributes 0 to the mean."""
    assert aggregate_loss(LOSS[:1], MASK[:1] * 0, "bnpo", num_ranks=2).item() == 0.0


def trl_bnpo(per_token_loss, mask):
    """One process's micro-batch, one gradient-accumulation step."""
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


def test_equals_trl_value_and_gradient():
    ours_in, trl_in = LOSS.clone().requires_grad_(True), LOSS.clone().requires_grad_(True)
    ours = sum(shares(ours_in, MASK))
    trl = sum(trl_bnpo(trl_in[s], MASK[s]) for s in RANKS) / len(RANKS)  # DDP's mean over processes
    ours.backward(), trl.backward()
    assert ours.item() == pytest.approx(trl.item(), abs=1e-12)
    assert torch.allclose(ours_in.grad, trl_in.grad, rtol=0.0, atol=1e-12)


def _first_step(model_dir, rows, **kwargs):
    """The first step's (loss, gradient norm). At ratio 1 with equal lengths the loss is ~0; the
    gradient is what the aggregation scales."""
    module = RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, seed=5, seed_per_prompt=True,
                      generation=dict(max_new_tokens=6, max_prompt_length=8), lr=1e-3, max_grad_norm=None, **kwargs)
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    return trainer.callback_metrics["loss"].item(), trainer.callback_metrics["grad_norm"].item()


def test_module_micro_batches_keep_the_ranks_token_mean(warm_start_dir, arithmetic_rows):
    """The rank's mini-batch is bnpo's unit, not a micro-batch: micro-batches of 4 rows give the
    one-pass loss and gradient, and on one process bnpo is the token mean."""
    one_pass = _first_step(warm_start_dir, arithmetic_rows, loss_aggregation="bnpo")
    micro = _first_step(warm_start_dir, arithmetic_rows, loss_aggregation="bnpo", micro_batch_size=4)
    token_mean = _first_step(warm_start_dir, arithmetic_rows, loss_aggregation="token-mean")
    assert one_pass[1] > 1e-3
    for other in (micro, token_mean):
        assert other == pytest.approx(one_pass, rel=1e-4, abs=1e-6)
