"""TRL's KL terms are ours: ``k3`` is ``use_bias_correction_kl=False``, ``k3_ratio`` is ``True``.

TRL's formula is transcribed from ``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss``
(TRL main, 1.10.0.dev0), at its default ``importance_sampling_level="token"``.
"""
import math

import pytest
import torch

from lightning_rlpt.algorithms.kl import KL_ESTIMATORS


def trl_per_token_kl(per_token_logps, ref_per_token_logps, old_per_token_logps, use_bias_correction_kl):
    """TRL's per-token KL term, transcribed (``GRPOTrainer._compute_loss``)."""
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    if use_bias_correction_kl:
        per_token_kl = per_token_kl * coef_1
    return per_token_kl


def test_k3_ratio_by_hand():
    """π = (.5, .25), π_ref = (.25, .5), π_old = (.4, .25):
    token 1: k3 = e^{-ln 2} + ln 2 - 1 = 0.193147, ρ = 1.25 → 0.241434;
    token 2: k3 = e^{ln 2} - ln 2 - 1 = 0.306853, ρ = 1 → 0.306853."""
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    old = torch.tensor([[math.log(0.4), math.log(0.25)]], dtype=torch.float64)
    value = KL_ESTIMATORS.get("k3_ratio")(logp, ref, old, torch.ones(1, 2))
    assert value.tolist()[0] == pytest.approx([0.241434, 0.306853], abs=1e-6)


@pytest.mark.parametrize("name, corrected", [("k3", False), ("k3_ratio", True)])
def test_equals_trl_formula_value_and_gradient(name, corrected):
    """Same value and same gradient as TRL's term on the same inputs, off-policy (π_old ≠ π)."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(3, 6, dtype=torch.float64, generator=gen)
    ref = base + 0.5 * torch.randn(3, 6, dtype=torch.float64, generator=gen)
    old = base + 0.3 * torch.randn(3, 6, dtype=torch.float64, generator=gen)
    ours_in, trl_in = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    ours = KL_ESTIMATORS.get(name)(ours_in, ref, old, torch.ones(3, 6))
    trl = trl_per_token_kl(trl_in, ref, old, corrected)
    assert torch.allclose(ours, trl, atol=1e-12)
    ours.sum().backward(), trl.sum().backward()
    assert torch.allclose(ours_in.grad, trl_in.grad, atol=1e-12)


def test_k3_ratio_has_k1_gradient_token_by_token():
    """∇(k3·ρ) = ρ·δ·∇logπ = ∇k1 per token (not only in expectation), while the values differ."""
    gen = torch.Generator().manual_seed(1)
    logp0 = torch.randn(2, 5, dtype=torch.float64, generator=gen)
    ref = logp0 + torch.randn(2, 5, dtype=torch.float64, generator=gen)
    old = logp0 + 0.4 * torch.randn(2, 5, dtype=torch.float64, generator=gen)
    grads, values = {}, {}
    for name in ("k1", "k3_ratio"):
        logp = logp0.clone().requires_grad_(True)
        values[name] = KL_ESTIMATORS.get(name)(logp, ref, old, torch.ones(2, 5))
        values[name].sum().backward()
        grads[name] = logp.grad
    assert torch.allclose(grads["k3_ratio"], grads["k1"], atol=1e-12)
    assert not torch.allclose(values["k3_ratio"], values["k1"], atol=1e-3)


def test_k3_ratio_value_is_unbiased_off_policy():
    """Σ_a π_old(a)·k3_ratio(a) = KL(π‖π_ref) for samples from an older policy (k3 alone is not)."""
    gen = torch.Generator().manual_seed(2)
    logp = torch.randn(7, dtype=torch.float64, generator=gen).log_softmax(-1)
    ref = torch.randn(7, dtype=torch.float64, generator=gen).log_softmax(-1)
    old = (logp + torch.randn(7, dtype=torch.float64, generator=gen)).log_softmax(-1)
    exact = (logp.exp() * (logp - ref)).sum()
    mean = {name: (old.exp() * KL_ESTIMATORS.get(name)(logp[None], ref[None], old[None])[0]).sum()
            for name in ("k3", "k3_ratio")}
    assert mean["k3_ratio"].item() == pytest.approx(exact.item(), abs=1e-12)
    assert mean["k3"].item() != pytest.approx(exact.item(), abs=1e-3)


def test_k3_ratio_trains_as_k1_in_a_real_fit(warm_start_dir, arithmetic_rows):
    """Two SGD steps of a real fit (the second with a reference that differs from the policy):
    ``k3_ratio`` moves the weights as ``k1`` does, ``k3`` does not; the logged loss differs."""
    from functools import partial

    import tiny_task as task
    from conftest import quiet_trainer
    from lightning_rlpt import PromptDataModule, RLModule

    def fit(estimator):
        module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=1.0,
                          kl_estimator=estimator, optimizer=partial(torch.optim.SGD, lr=0.5), max_grad_norm=None,
                          updates_per_rollout=2, generation=dict(max_new_tokens=4, max_prompt_length=8))
        trainer = quiet_trainer(max_steps=2)
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows[:4], batch_size=4))
        return torch.cat([p.detach().flatten() for p in module.policy.parameters()]), trainer.callback_metrics["loss"]

    (k1, k1_loss), (ratio, ratio_loss), (k3, _) = fit("k1"), fit("k3_ratio"), fit("k3")
    assert torch.allclose(ratio, k1, atol=1e-6) and not torch.allclose(k3, k1, atol=1e-6)
    assert not torch.isclose(ratio_loss, k1_loss, atol=1e-6)


@pytest.mark.parametrize("name", ["k1", "k3_ratio"])
def test_ratio_estimators_stay_finite_far_off_policy(name):
    """log π - log π_old = 100 (a row far staler than any clip allows): the importance ratio is
    clamped at e^20 as every other exponentiated log-ratio, so value and gradient stay finite
    (an unclamped exp gives inf, and inf·0 = NaN in the gradient)."""
    logp = torch.tensor([[100.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[99.0, 0.0]])
    old = torch.zeros(1, 2)
    value = KL_ESTIMATORS.get(name)(logp, ref, old, torch.ones(1, 2))
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(logp.grad).all()
    k = 1.0 if name == "k1" else math.exp(-1) + 1 - 1  # δ = 1 → k1's value δ, k3 = e^{-1} + 1 - 1
    assert value[0, 0].item() == pytest.approx(k * math.exp(20), rel=1e-5)
