"""``entropy_coef`` (TRL's name and meaning): the loss minus c × the mean token entropy of the
trained tokens, whatever the policy term's aggregation. The value by hand from the model's full
logits, the gradient equal to autograd's of that mean (through the fused kernel's entropy backward
and through full logits), TRL's formula on the same tensors, the metrics, and bad values refused."""
import math

import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.algorithms.entropy_bonus import entropy_bonus
from lightning_rlpt.model.logprobs import position_ids_for
from lightning_rlpt.rewards import score_experience
from lightning_rlpt.rollout import collect

GEN = dict(max_new_tokens=6, max_prompt_length=8, temperature=0.7)


def _module(model_dir, **kwargs):
    return RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, seed=3, kl_coef=0.0,
                    generation=GEN, max_grad_norm=None, **kwargs)


def _experience(module, rows):
    batch = dict(prompt=[r["prompt"] for r in rows], answer=[r["answer"] for r in rows])
    exp, _ = collect.rollout(module.engine, module.tokenizer, batch, module.group_size, module.sampling, 1, "cpu")
    score_experience(exp, module.rewards)
    exp.advantages = torch.randn(len(exp), generator=torch.Generator().manual_seed(0))
    return exp


def _mean_entropy_by_hand(module, exp):
    """The token mean of ``-Σ_v p log p`` over the trained tokens, from the model's full logits at
    the sampling temperature (no code of the library's log-prob path)."""
    mask = exp.attention_mask
    logits = module.policy(input_ids=exp.input_ids, attention_mask=mask, position_ids=position_ids_for(mask)).logits
    width = exp.completion_ids.shape[1]
    logp = (logits[:, -width - 1:-1].float() / GEN["temperature"]).log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    trained = module.loss_mask(exp)
    return (entropy * trained).sum() / trained.sum()


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum-norm"])
def test_loss_is_the_policy_loss_minus_coef_times_the_mean_token_entropy(warm_start_dir, arithmetic_rows, aggregation):
    module = _module(warm_start_dir, loss_aggregation=aggregation)
    exp = _experience(module, arithmetic_rows[:4])
    without, _ = module.loss(exp)
    module.hparams.entropy_coef = 0.3
    with_bonus, metrics = module.loss(exp)
    with torch.no_grad():
        mean_h = _mean_entropy_by_hand(module, exp).item()
    assert mean_h > 0.1
    # the same token mean for either aggregation: TRL's bonus is not rescaled to the loss type
    assert with_bonus.item() == pytest.approx(without.item() - 0.3 * mean_h, rel=1e-5, abs=1e-6)
    assert metrics["policy_loss"] == pytest.approx(without.item(), rel=1e-6)
    assert metrics["loss"] == pytest.approx(with_bonus.item(), rel=1e-6)


@pytest.mark.parametrize("fused", [True, False])
def test_bonus_gradient_is_autograds_gradient_of_the_mean_entropy(warm_start_dir, arithmetic_rows, fused):
    """Zero advantages and no KL leave only -c · H̄: its gradient, through the fused kernel's entropy
    backward or through full logits, is that of the hand-computed mean entropy."""
    module = _module(warm_start_dir, entropy_coef=0.5, use_fused_kernel=fused)
    exp = _experience(module, arithmetic_rows[:4])
    exp.advantages = torch.zeros(len(exp))
    module.policy.zero_grad()
    module.loss(exp)[0].backward()
    ours = {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}
    module.policy.zero_grad()
    (-0.5 * _mean_entropy_by_hand(module, exp)).backward()
    by_hand = {n: p.grad for n, p in module.policy.named_parameters() if p.grad is not None}
    assert ours.keys() == by_hand.keys()
    assert max(g.abs().max().item() for g in by_hand.values()) > 1e-4  # the entropy really moves the weights
    for name in by_hand:
        torch.testing.assert_close(ours[name], by_hand[name], atol=2e-6, rtol=1e-4, msg=name)


def _trl_dapo_bonus(entropies, mask, entropy_mask, coef, num_items_in_batch, num_processes=1):
    """Transcribed from TRL (trl/trainer/grpo_trainer.py, ``GRPOTrainer._compute_loss``, the
    entropy bonus under ``loss_type`` "dapo", TRL's default): ``effective_mask = mask if
    entropy_mask is None else mask * entropy_mask``; ``normalizer = num_items_in_batch /
    num_processes``; ``entropy_loss = (entropies * effective_mask).sum() / normalizer``;
    ``loss = loss - coef * entropy_loss``. Returns the subtracted term."""
    effective_mask = mask if entropy_mask is None else mask * entropy_mask
    normalizer = num_items_in_batch.clamp(min=1.0) / num_processes
    return coef * (entropies * effective_mask).sum() / normalizer


def test_the_bonus_is_trls_on_the_same_tensors():
    g = torch.Generator().manual_seed(4)
    entropies = torch.rand(5, 7, generator=g) * 3
    mask = (torch.rand(5, 7, generator=g) > 0.3).float()
    kept = (torch.rand(5, 7, generator=g) > 0.5).float()
    tokens = mask.sum()
    for entropy_mask in (None, kept):
        theirs = _trl_dapo_bonus(entropies, mask, entropy_mask, 0.01, tokens)
        ours = 0.01 * entropy_bonus(entropies, mask, tokens.item(), entropy_mask)
        torch.testing.assert_close(ours, theirs)
    # by hand: rows [1, 3] and [2, (9 masked)] -> (1 + 3 + 2) / 3 tokens
    h, m = torch.tensor([[1.0, 3.0], [2.0, 9.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert entropy_bonus(h, m, 3).item() == 2.0
    assert entropy_bonus(h, m, 3, policy_mask=torch.tensor([[0.0, 1.0], [1.0, 1.0]])).item() == pytest.approx(5 / 3)


def test_a_fit_logs_the_coefficient_once_per_step_whatever_the_micro_batches(warm_start_dir, arithmetic_rows):
    module = _module(warm_start_dir, entropy_coef=0.3, micro_batch_size=2)
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))  # 8 rows: 4 micro-batches
    logged = {k: v.item() for k, v in trainer.callback_metrics.items()}
    assert logged["entropy_coef"] == pytest.approx(0.3)
    # the micro-batches' shares add up to the step's: loss = policy_loss - c * mean token entropy
    assert logged["entropy"] > 0.1
    assert logged["loss"] == pytest.approx(logged["policy_loss"] - 0.3 * logged["entropy"], rel=1e-5, abs=1e-6)


def test_off_by_default_and_no_metric(warm_start_dir, arithmetic_rows):
    module = _module(warm_start_dir)
    _, metrics = module.loss(_experience(module, arithmetic_rows[:2]))
    assert "entropy_coef" not in metrics and "policy_loss" not in metrics


@pytest.mark.parametrize("bad", [math.nan, math.inf, "0.01", True])
def test_bad_coefficient_is_refused_before_the_model_loads(bad):
    with pytest.raises(ValueError, match=r"entropy_coef must be a finite number .*0.001-0.01 is usual"):
        RLModule("org/never-downloaded", reward_funcs=[task.exact_answer], entropy_coef=bad)


def test_a_resume_under_another_coefficient_or_aggregation_is_refused(warm_start_dir, arithmetic_rows, tmp_path):
    """Both change what is trained: `checkpoint.ALGORITHM_KEYS` compares them at resume."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from conftest import quiet_trainer
    from lightning_rlpt import PromptDataModule

    def fit(module, steps, ckpt_path=None, **kwargs):
        quiet_trainer(max_steps=steps, **kwargs).fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2),
                                                     ckpt_path=ckpt_path)

    fit(_module(warm_start_dir, entropy_coef=0.01), 1, enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=str(tmp_path), filename="ckpt", every_n_train_steps=1)])
    changed = _module(warm_start_dir, entropy_coef=0.02, multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match=r"entropy_coef: saved 0.01, now 0.02; multi_objective_aggregation: saved "
                                         r"'sum_then_normalize', now 'normalize_then_sum'"):
        fit(changed, 2, ckpt_path=str(tmp_path / "ckpt.ckpt"))
