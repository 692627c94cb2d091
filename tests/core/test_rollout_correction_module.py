"""Through `RLModule`: the training step's loss and gradient carry the rollout-correction
weights, for every mode (``token_tis``, ``seq_tis``, ``token_mis``, ``seq_mis``). The engine's
behaviour log-probs are set a known log-ratio δ below the policy's, so the weights are known by
hand; the corrected loss equals the uncorrected one with those weights given as token weights,
and differs from the loss without them. ``rollout_correction_kl`` moves the weights onto the KL
term as well."""
import math

import pytest
import torch

import tiny_task as task
from lightning_rlpt import RLModule
from lightning_rlpt.rewards import score_experience
from lightning_rlpt.rollout import collect

CAP = 1.3
MODES = ("token_tis", "seq_tis", "token_mis", "seq_mis")


def _module(model_dir, **kwargs):
    # δ is set against `policy_logprobs` (the fused kernel), and the weights by hand assume the loss
    # sees those very log-probs: the forward-pass head path's agree only to fp32 rounding (~1e-7),
    # which seq_tis's exp(Σδ) carries past this test's tolerance. The head paths' own equality is
    # tests/stages/test_head_in_forward.py's.
    return RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, seed=5, seed_per_prompt=True,
                    generation=dict(max_new_tokens=5, max_prompt_length=8), max_grad_norm=None,
                    loss_aggregation="token-mean", rollout_correction_cap=CAP, head_gradient="recompute", **kwargs)


def _experience(module, rows):
    """A rollout whose behaviour log-probs sit δ (uniform in ±0.4, fixed) below the policy's."""
    batch = dict(prompt=[r["prompt"] for r in rows], answer=[r["answer"] for r in rows])
    exp, _ = collect.rollout(module.engine, module.tokenizer, batch, module.group_size, module.sampling, 1, "cpu")
    score_experience(exp, module.rewards)
    gen = torch.Generator().manual_seed(0)
    exp.advantages = torch.randn(len(exp), generator=gen)  # every row trains
    with torch.no_grad():
        current = module.policy_logprobs(exp)[0].float()
    delta = (torch.rand(current.shape, generator=gen) * 0.8 - 0.4) * module.loss_mask(exp)
    exp.behaviour_logprobs = current - delta
    return exp, delta


def _by_hand(delta, mask, mode):
    """The weights of ``mode`` from δ = log(π_old/π_behav), written out per token and per row."""
    rows = []
    for d_row, m_row in zip(delta.tolist(), mask.tolist()):
        seq = math.exp(sum(d * m for d, m in zip(d_row, m_row)))
        ws = [seq if mode.startswith("seq") else math.exp(d) for d in d_row]
        ws = [min(w, CAP) if mode.endswith("tis") else (w if w <= CAP else 0.0) for w in ws]
        rows.append([w * m for w, m in zip(ws, m_row)])
    return torch.tensor(rows)


def _loss_and_grads(module, exp):
    module.policy.zero_grad()
    loss, _ = module.loss(exp)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in module.policy.parameters() if p.grad is not None]


@pytest.fixture(scope="module")
def rollout(warm_start_dir, arithmetic_rows):
    module = _module(warm_start_dir, kl_coef=0.0)
    return module, *_experience(module, arithmetic_rows[:4])


@pytest.mark.parametrize("mode", MODES)
def test_the_loss_and_gradient_carry_each_modes_weights(rollout, mode):
    module, exp, delta = rollout
    weights = _by_hand(delta, module.loss_mask(exp), mode)
    assert 0 < (weights > 0).sum() and ((weights - 1).abs() > 1e-2).any()  # the weights do something
    module.hparams.rollout_correction = mode
    loss, grads = _loss_and_grads(module, exp)
    module.hparams.rollout_correction = None  # the same step, the weights given by hand instead
    exp.token_weights = weights
    by_hand, by_hand_grads = _loss_and_grads(module, exp)
    exp.token_weights = None
    plain, plain_grads = _loss_and_grads(module, exp)
    assert loss == pytest.approx(by_hand, rel=1e-5, abs=1e-7)
    for a, b in zip(grads, by_hand_grads):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-4)
    assert abs(loss - plain) > 1e-4  # without the weights the step is another one
    assert max((a - b).abs().max().item() for a, b in zip(grads, plain_grads)) > 1e-4


@pytest.mark.parametrize("correct_kl", [False, True])
def test_rollout_correction_kl_chooses_whether_the_kl_term_is_weighted(warm_start_dir, arithmetic_rows, correct_kl):
    """Zero advantages leave β·KL alone: unweighted by default (TRL, verl), weighted with
    ``rollout_correction_kl=True``."""
    module = _module(warm_start_dir, kl_coef=0.5, kl_estimator="k3", rollout_correction="token_mis",
                     rollout_correction_kl=correct_kl)
    with torch.no_grad():  # move the policy off its reference so the KL is not 0
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    exp, delta = _experience(module, arithmetic_rows[:4])
    with torch.no_grad():
        exp.ref_logprobs = module._logprobs(module.reference, exp)[0]
    exp.advantages = torch.zeros(len(exp))
    loss, _ = module.loss(exp)
    module.hparams.rollout_correction, module.hparams.rollout_correction_kl = None, False
    plain, _ = module.loss(exp)
    exp.token_weights = _by_hand(delta, module.loss_mask(exp), "token_mis")
    weighted, _ = module.loss(exp)
    assert abs(plain.item() - weighted.item()) > 1e-4  # the weights would change the KL term
    assert loss.item() == pytest.approx((weighted if correct_kl else plain).item(), rel=1e-5)
