"""``top_entropy_quantile`` (TRL's name; Wang et al., arXiv 2506.01939): the policy-gradient
term keeps only the mini-batch's highest-entropy tokens. The loss equals the loss with the other
tokens' weights zeroed; the KL term and the denominators still cover every token; micro-batches
give the one-pass gradient (the threshold spans the whole mini-batch); bad values are refused
before the model loads."""
import pytest
import torch
from lightning.pytorch.callbacks import Callback

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.algorithms.entropy_mask import entropy_threshold, high_entropy_mask
from lightning_rlpt.rewards import score_experience
from lightning_rlpt.rollout import collect

GEN = dict(max_new_tokens=6, max_prompt_length=8)
RHO = 0.3


def _module(model_dir, **kwargs):
    return RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, seed=5, seed_per_prompt=True,
                    generation=GEN, max_grad_norm=None, **kwargs)


def _experience(module, rows):
    batch = dict(prompt=[r["prompt"] for r in rows], answer=[r["answer"] for r in rows])
    exp, _ = collect.rollout(module.engine, module.tokenizer, batch, module.group_size, module.sampling, 1, "cpu")
    score_experience(exp, module.rewards)
    exp.advantages = torch.randn(len(exp), generator=torch.Generator().manual_seed(0))  # every row trains
    return exp


def _loss_and_grads(module, exp):
    module.policy.zero_grad()
    loss, metrics = module.loss(exp)
    loss.backward()
    return loss.item(), metrics, [p.grad.clone() for p in module.policy.parameters() if p.grad is not None]


def _high_entropy_tokens(module, exp):
    with torch.no_grad():
        _, entropy = module.policy_logprobs(exp, with_entropy=True)
    mask = module.loss_mask(exp)
    return high_entropy_mask(entropy, mask, entropy_threshold(entropy, mask, RHO)), mask


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_loss_equals_the_loss_with_the_low_entropy_tokens_weighted_zero(warm_start_dir, arithmetic_rows, aggregation):
    module = _module(warm_start_dir, kl_coef=0.0, loss_aggregation=aggregation, top_entropy_quantile=RHO)
    exp = _experience(module, arithmetic_rows[:4])
    keep, mask = _high_entropy_tokens(module, exp)
    assert 0 < keep.sum() < mask.sum()
    loss, metrics, grads = _loss_and_grads(module, exp)
    assert metrics["top_entropy/kept_fraction"] == pytest.approx((keep.sum() / mask.sum()).item())
    module.hparams.top_entropy_quantile = 1.0  # every token, the others weighted 0 by hand
    exp.token_weights = keep
    by_hand, _, by_hand_grads = _loss_and_grads(module, exp)
    assert loss == pytest.approx(by_hand, rel=1e-6, abs=1e-8)
    for a, b in zip(grads, by_hand_grads):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-5)
    exp.token_weights = None
    everything, _, _ = _loss_and_grads(module, exp)
    assert abs(everything - loss) > 1e-4  # the mask did something


def test_kl_and_denominators_still_cover_every_token(warm_start_dir, arithmetic_rows):
    """Zero advantages leave only β·KL: the same loss with and without the entropy mask."""
    module = _module(warm_start_dir, kl_coef=0.5, loss_aggregation="token-mean", top_entropy_quantile=RHO)
    with torch.no_grad():  # move the policy off its reference so the KL is not 0
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    exp = _experience(module, arithmetic_rows[:4])
    with torch.no_grad():
        exp.ref_logprobs = module._logprobs(module.reference, exp)[0]
    exp.advantages = torch.zeros(len(exp))
    masked, _ = module.loss(exp)
    module.hparams.top_entropy_quantile = 1.0
    unmasked, _ = module.loss(exp)
    assert masked.item() > 1e-4
    assert masked.item() == pytest.approx(unmasked.item(), rel=1e-6)


class GradRecorder(Callback):
    def __init__(self):
        self.steps = []

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.steps.append({n: p.grad.detach().clone() for n, p in module.policy.named_parameters() if p.grad is not None})


def _fit(model_dir, rows, **kwargs):
    module = _module(model_dir, kl_coef=0.1, **kwargs)
    calls = []
    forward = module._logprobs
    module._logprobs = lambda *a, **k: calls.append(len(a[1])) or forward(*a, **k)
    recorder = GradRecorder()
    trainer = quiet_trainer(max_steps=2, callbacks=[recorder])
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    return recorder.steps, trainer.callback_metrics, calls


def _assert_same(a, b):
    assert len(a) == len(b) == 2
    for step_a, step_b in zip(a, b):
        for name in step_a:
            assert torch.allclose(step_a[name], step_b[name], atol=1e-6, rtol=1e-4), name


@pytest.fixture(scope="module")
def one_pass(warm_start_dir, arithmetic_rows):
    return _fit(warm_start_dir, arithmetic_rows, top_entropy_quantile=RHO)


@pytest.mark.parametrize("cap", [dict(micro_batch_size=4), dict(max_tokens_per_micro_batch=4 * 14)])
def test_micro_batched_gradient_equals_one_pass(one_pass, warm_start_dir, arithmetic_rows, cap):
    grads, metrics, calls = one_pass
    micro, micro_metrics, micro_calls = _fit(warm_start_dir, arithmetic_rows, top_entropy_quantile=RHO, **cap)
    _assert_same(grads, micro)
    assert micro_metrics["top_entropy/kept_fraction"].item() == pytest.approx(metrics["top_entropy/kept_fraction"].item())
    # One pass: a reference forward and the loss's, per step. Micro-batched: + the entropy pre-pass.
    assert calls == [16, 16, 16, 16]
    assert len(micro_calls) > len(calls) and sum(micro_calls) == 16 * 6


def test_kept_fraction_is_rho_of_the_trained_tokens(one_pass):
    metrics = one_pass[1]
    tokens = 16 * metrics["completions/mean_length"].item()
    # Ties at the threshold are all kept (>=): the G rows of a group share their first token's
    # entropy (same prompt), so up to G - 1 extra tokens.
    assert -1.0 / tokens <= metrics["top_entropy/kept_fraction"].item() - RHO <= 4.0 / tokens


@pytest.mark.parametrize("rho", [0.0, -0.1, 1.2])
def test_bad_quantiles_are_refused_at_construction(warm_start_dir, rho):
    with pytest.raises(ValueError, match=r"top_entropy_quantile must be in \(0, 1\].*the paper uses 0.2"):
        _module(warm_start_dir, top_entropy_quantile=rho)
