"""KL estimators on a small categorical policy: exact expected gradients vs the analytic ones.

For one categorical step with logits θ, π = softmax(θ): the expected gradient of an estimator
used as a loss is Σ_a π_a ∇_θ loss(a) (samples weighted by the detached probabilities), which
we compare with the analytic gradients of KL(π‖π_ref) and KL(π_ref‖π).
"""
import pytest
import torch

from lightning_rlpt.algorithms.kl import KL_ESTIMATORS, kl_value

torch.manual_seed(0)
THETA = torch.randn(5, dtype=torch.float64)
REF = torch.randn(5, dtype=torch.float64).log_softmax(-1)


def expected_gradient(name, old_theta=None):
    """Σ_a q_a ∇ loss(a), with actions drawn from q = π_old (π itself when old_theta is None)."""
    theta = THETA.clone().requires_grad_(True)
    logp = theta.log_softmax(-1)
    old = (old_theta if old_theta is not None else THETA).log_softmax(-1)
    q = old.exp()
    loss = KL_ESTIMATORS.get(name)(logp.unsqueeze(0), REF.unsqueeze(0), old.unsqueeze(0), torch.ones(1, 5))
    (q * loss[0]).sum().backward()
    return theta.grad


def analytic(kind):
    theta = THETA.clone().requires_grad_(True)
    logp = theta.log_softmax(-1)
    kl = (logp.exp() * (logp - REF)).sum() if kind == "reverse" else (REF.exp() * (REF - logp)).sum()
    kl.backward()
    return theta.grad


def test_default_k1_gives_the_reverse_kl_gradient():
    assert torch.allclose(expected_gradient("k1"), analytic("reverse"), atol=1e-12)


def test_k1_stays_exact_off_policy():
    """Samples from an older policy: the importance ratio keeps k1's gradient exact."""
    old_theta = THETA + torch.randn(5, dtype=torch.float64)
    assert torch.allclose(expected_gradient("k1", old_theta), analytic("reverse"), atol=1e-12)


def test_k2_matches_reverse_kl_on_policy_only():
    assert torch.allclose(expected_gradient("k2"), analytic("reverse"), atol=1e-12)
    old_theta = THETA + torch.randn(5, dtype=torch.float64)
    assert not torch.allclose(expected_gradient("k2", old_theta), analytic("reverse"), atol=1e-3)


def test_k3_as_loss_gives_the_forward_kl_gradient():
    g = expected_gradient("k3")
    assert torch.allclose(g, analytic("forward"), atol=1e-12)
    assert not torch.allclose(g, analytic("reverse"), atol=1e-3)


def test_kl_metric_is_unbiased_for_reverse_kl():
    logp = THETA.log_softmax(-1)
    expected = (logp.exp() * kl_value(logp, REF)).sum()
    assert expected.item() == pytest.approx((logp.exp() * (logp - REF)).sum().item(), abs=1e-12)
    assert (kl_value(logp, REF) >= 0).all()


def test_unknown_estimator_lists_known():
    with pytest.raises(ValueError, match="known: .*k1.*k2.*k3"):
        KL_ESTIMATORS.get("k4")
