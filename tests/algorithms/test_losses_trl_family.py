"""SAPO, LUSPO and VESPO (TRL's ``loss_type`` values): values and gradients by hand, and the same
value and gradient as TRL's formula on the same inputs.

TRL's formulas are transcribed from ``trl/trainer/grpo_trainer.py`` (TRL main, July 2026):
``GRPOTrainer._compute_loss`` (the ``sapo``/``luspo``/``vespo`` branches of the per-token loss
and of the normalisation) and ``GRPOTrainer.get_gamma_weights`` (VESPO's φ).
"""
import math

import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import POLICY_LOSSES, PromptDataModule, RLModule
from lightning_rlpt.algorithms.aggregation import aggregate_loss
from lightning_rlpt.algorithms.presets import resolve_objective

F64 = torch.float64


def run(name, logp, old, adv, mask, **kw):
    """Per-token loss, d(Σ mask·loss)/d logπ and stats."""
    logp = torch.tensor(logp, dtype=F64, requires_grad=True)
    mask = torch.tensor(mask, dtype=F64)
    loss, stats = POLICY_LOSSES.get(name)(logp, torch.tensor(old, dtype=F64), torch.tensor(adv, dtype=F64), mask, **kw)
    (loss * mask).sum().backward()
    return loss.detach(), logp.grad, stats


def random_batch(seed, rows=4, cols=6):
    """Log-probs, π_old's, behaviour log-probs, advantages of both signs and a ragged mask."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, cols, dtype=F64, generator=gen) * 2 - 0.1
    old = logp + 0.2 * torch.randn(rows, cols, dtype=F64, generator=gen)
    behav = old + 0.1 * torch.randn(rows, cols, dtype=F64, generator=gen)
    adv = torch.tensor([1.3, -0.7, 0.0, -2.1], dtype=F64)[:rows]
    mask = torch.ones(rows, cols, dtype=F64)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return logp, old, behav, adv, mask


def same(ours, trl, atol=1e-12):
    """Equal values and gradients (absolute tolerance only)."""
    return all(torch.allclose(a, b, rtol=0.0, atol=atol) for a, b in zip(ours, trl))


def value_and_grad(fn, logp):
    x = logp.clone().requires_grad_(True)
    value = fn(x)
    value.backward()
    return value.detach(), x.grad


# ---------------------------------------------------------------- SAPO
def test_sapo_by_hand():
    """r = 1.5, A = 1, τ = 1: σ(0.5) = 0.6224593, f = 4σ = 2.4898373, loss −2.4898373,
    gradient −A·4σ(1−σ)·r = −0.9400148·1.5 = −1.4100223. r = 0.5, A = −2, τ = 1.05:
    σ(−0.525) = 0.3716838, f = 4σ/1.05 = 1.4159383, loss 2.8318767, gradient 2·4σ(1−σ)·0.5
    = 4σ(1−σ) = 0.9341398."""
    loss, grad, stats = run("sapo", [[math.log(1.5)], [math.log(0.5)]], [[0.0], [0.0]], [1.0, -2.0], [[1], [1]])
    assert loss.flatten().tolist() == pytest.approx([-2.4898373, 2.8318767], abs=1e-7)
    assert grad.flatten().tolist() == pytest.approx([-1.4100223, 0.9341398], abs=1e-7)
    assert stats["sapo/gate_weight"].flatten().tolist() == pytest.approx([0.9400148, 0.9341398], abs=1e-7)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_sapo_on_policy_gradient_is_the_plain_policy_gradient(adv):
    """At r = 1 the gate's slope is 4·¼ = 1 for any τ: the gradient is −A, as PPO's inside its clip."""
    _, grad, _ = run("sapo", [[0.0]], [[0.0]], [adv], [[1]], temperature_pos=3.0, temperature_neg=7.0)
    assert grad.item() == pytest.approx(-adv)


def trl_sapo(per_token_logps, old_per_token_logps, advantages, mask, pos=1.0, neg=1.05):
    """TRL: ``loss_type="sapo"`` at ``importance_sampling_level="token"``, then its
    ``["grpo", "sapo"]`` normalisation (one gradient-accumulation step)."""
    advantages = advantages.unsqueeze(1)
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    temperatures = torch.where(advantages > 0, pos, neg)
    soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
    per_token_loss = -soft_coef_1 * advantages
    return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


@pytest.mark.parametrize("temps, atol", [({}, 1e-7), (dict(temperature_pos=0.5, temperature_neg=2.0), 1e-12)])
def test_sapo_equals_trl(temps, atol):
    """TRL's ``torch.where(advantages > 0, 1.0, 1.05)`` holds τ in float32 (1.05 → 1.04999995), so at
    the defaults the two agree to 1e-7; at temperatures float32 holds exactly, to 1e-12."""
    logp, old, _, adv, mask = random_batch(0)
    trl_temps = dict(pos=temps.get("temperature_pos", 1.0), neg=temps.get("temperature_neg", 1.05))
    ours = value_and_grad(lambda x: aggregate_loss(POLICY_LOSSES.get("sapo")(x, old, adv, mask, **temps)[0], mask,
                                                   "seq-mean-token-mean"), logp)
    trl = value_and_grad(lambda x: trl_sapo(x, old, adv, mask, **trl_temps), logp)
    assert same(ours, trl, atol)


def test_sapo_refuses_a_non_positive_temperature():
    with pytest.raises(ValueError, match=r"temperatures must be > 0 .*temperature_neg=0.*1.0 and 1.05"):
        run("sapo", [[0.0]], [[0.0]], [1.0], [[1]], temperature_neg=0.0)


# ---------------------------------------------------------------- LUSPO
def test_luspo_by_hand():
    """GSPO's example scaled by length. Row 0 (3 tokens, A = 1): s = e^0.2 > 1.2, clipped: GSPO's
    −1.2 per token, ×3 = −3.6, no gradient. Row 1 (2 tokens, A = −2, padding holds 7.0):
    s = e^−0.025, GSPO's 2s per token, ×2 = 4s, gradient 4s. seq-mean-token-mean:
    (1/2)(3·(−1.2) + 2·2s) = (1/N) Σ |y_i| ℓ_i."""
    delta = [[0.1, 0.2, 0.3], [-0.1, 0.05, 7.0]]
    mask = [[1, 1, 1], [1, 1, 0]]
    loss, grad, stats = run("luspo", delta, [[0.0] * 3] * 2, [1.0, -2.0], mask, clip_low=0.2, clip_high=0.2)
    s1 = math.exp(-0.025)
    assert loss[0].tolist() == pytest.approx([-3.6] * 3) and grad[0].tolist() == [0.0] * 3
    assert loss[1, :2].tolist() == pytest.approx([4 * s1] * 2) and grad[1].tolist() == pytest.approx([4 * s1, 4 * s1, 0])
    assert stats["clip_ratio/high"].tolist() == [1, 0]  # one clip decision per sequence
    total = aggregate_loss(loss, torch.tensor(mask, dtype=F64), "seq-mean-token-mean").item()
    assert total == pytest.approx((3 * -1.2 + 2 * 2 * s1) / 2)


def trl_luspo(per_token_logps, old_per_token_logps, advantages, mask, epsilon_low, epsilon_high):
    """TRL: ``loss_type="luspo"`` with ``importance_sampling_level="sequence"`` (which it requires)."""
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    return (per_token_loss * mask.sum(1, keepdim=True)).mean()


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.05, 0.05)], ids=["clipped", "mostly-unclipped"])
def test_luspo_equals_trl(eps):
    logp, old, _, adv, mask = random_batch(1)
    ours = value_and_grad(lambda x: aggregate_loss(POLICY_LOSSES.get("luspo")(x, old, adv, mask, clip_low=eps[0],
                                                                              clip_high=eps[1])[0],
                                                   mask, "seq-mean-token-mean"), logp)
    trl = value_and_grad(lambda x: trl_luspo(x, old, adv, mask, *eps), logp)
    assert same(ours, trl)


# ---------------------------------------------------------------- VESPO
def test_vespo_by_hand():
    """π/π_old = (.4/.5)·(.5/.5) = 0.8 for row 0 (A = 1: k = 2, λ = 3) and row 1 (A = −1: k = 3, λ = 2).
    φ = e^λ w^k e^{−λw}: row 0 e^3·0.64·e^{−2.4} = 0.64·e^0.6 = 1.166156; row 1 e^2·0.512·e^{−1.6}
    = 0.512·e^0.4 = 0.763814. loss_t = −φ·A·logπ_t, gradient −φ·A."""
    logp = [[math.log(0.4), math.log(0.5)]] * 2
    old = [[math.log(0.5), math.log(0.5)]] * 2
    loss, grad, stats = run("vespo", logp, old, [1.0, -1.0], [[1, 1], [1, 1]])
    phi = [0.64 * math.exp(0.6), 0.512 * math.exp(0.4)]
    assert phi == pytest.approx([1.166156, 0.763814], abs=1e-6)
    assert stats["vespo/phi_seq"].tolist() == pytest.approx(phi)
    assert loss.flatten().tolist() == pytest.approx([phi[0] * -l for l in logp[0]] + [phi[1] * l for l in logp[1]])
    assert grad.flatten().tolist() == pytest.approx([-phi[0]] * 2 + [phi[1]] * 2)


def test_vespo_weight_includes_the_behaviour_mismatch_and_is_one_at_w_one():
    """With behaviour log-probs (.5, .25): w = 0.8 · (π_old/π_behav = 1·2) = 1.6, φ = e^3·2.56·e^{−4.8}
    = 2.56·e^{−1.8} = 0.423165. Padding adds nothing to w; w = 1 gives φ = 1."""
    logp = [[math.log(0.4), math.log(0.5), -3.0]]
    old = [[math.log(0.5), math.log(0.5), -1.0]]
    behav = torch.tensor([[math.log(0.5), math.log(0.25), -9.0]], dtype=F64)
    _, _, stats = run("vespo", logp, old, [1.0], [[1, 1, 0]], behaviour_logprobs=behav)
    assert stats["vespo/phi_seq"][0].item() == pytest.approx(2.56 * math.exp(-1.8)) == pytest.approx(0.423165, abs=1e-6)
    _, _, stats = run("vespo", [[-1.0, -2.0]], [[-1.0, -2.0]], [-0.5], [[1, 1]])
    assert stats["vespo/phi_seq"][0].item() == pytest.approx(1.0)


def trl_gamma_weights(advantages, log_ratio_per_token, mask, importance_sampling_ratio, k_pos=2.0, lambda_pos=3.0,
                      k_neg=3.0, lambda_neg=2.0):
    """TRL: ``GRPOTrainer.get_gamma_weights``."""
    lower_clamp = math.log(1e-8)
    log_ratio_clamped = torch.clamp(log_ratio_per_token, -20.0, 20.0)
    seq_log_ratio = torch.sum(log_ratio_clamped * mask, dim=-1, keepdim=True)
    if importance_sampling_ratio is not None:
        log_is_ratio = torch.clamp(torch.log(importance_sampling_ratio), lower_clamp, 20.0)
        seq_log_ratio += torch.sum(log_is_ratio, dim=-1, keepdim=True)
    log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
    w_seq = torch.exp(log_w_seq)
    is_nonneg_adv = advantages >= 0
    k_seq = torch.where(is_nonneg_adv, k_pos, k_neg)
    lambda_seq = torch.where(is_nonneg_adv, lambda_pos, lambda_neg).clamp(min=1e-4)
    log_phi = lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def trl_vespo(per_token_logps, old_per_token_logps, advantages, mask, sampling_per_token_logps=None):
    """TRL: ``loss_type="vespo"``, its per-token loss and the ``["cispo", "dapo", "vespo"]``
    normalisation (one process: ``num_items_in_batch`` = the batch's tokens). With vLLM, TRL's
    ``importance_sampling_ratio`` is ``exp((old − sampling)·mask)`` (a cap it never reaches here)."""
    advantages = advantages.unsqueeze(1)
    ratio = None
    if sampling_per_token_logps is not None:
        ratio = torch.exp((old_per_token_logps - sampling_per_token_logps) * mask)
    with torch.no_grad():
        phi_seq = trl_gamma_weights(advantages, per_token_logps - old_per_token_logps, mask, ratio)
    per_token_loss = -phi_seq * advantages * per_token_logps
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


@pytest.mark.parametrize("with_behaviour", [False, True])
def test_vespo_equals_trl(with_behaviour):
    logp, old, behav, adv, mask = random_batch(2)
    behav = behav if with_behaviour else None
    ours = value_and_grad(lambda x: aggregate_loss(POLICY_LOSSES.get("vespo")(x, old, adv, mask,
                                                                              behaviour_logprobs=behav)[0],
                                                   mask, "token-mean"), logp)
    trl = value_and_grad(lambda x: trl_vespo(x, old, adv, mask, behav), logp)
    assert same(ours, trl)


def test_vespo_refuses_a_non_positive_lambda():
    with pytest.raises(ValueError, match=r"vespo needs k >= 0 and lambda > 0 .*lambda_neg=0"):
        run("vespo", [[0.0]], [[0.0]], [1.0], [[1]], lambda_neg=0.0)


# ---------------------------------------------------------------- presets and the module's checks
@pytest.mark.parametrize("name, expected", [
    ("luspo", ("luspo", "seq-mean-token-mean", 3e-4, 4e-4, 0.0)),
    ("vespo", ("vespo", "token-mean", 0.2, 0.2, 0.0)),
])
def test_presets(name, expected):
    cfg = resolve_objective(name, {})
    assert (cfg.policy_loss, cfg.loss_aggregation, cfg.clip_low, cfg.clip_high, cfg.kl_coef) == expected


def test_bare_sapo_takes_the_grpo_presets_aggregation():
    """TRL normalises ``sapo`` like ``grpo`` (per-sequence token means): the bare name does too."""
    assert resolve_objective("sapo", {}).loss_aggregation == "seq-mean-token-mean"


def test_vespo_is_self_correcting():
    assert POLICY_LOSSES.trait("vespo", "self_correcting")
    assert not POLICY_LOSSES.trait("sapo", "self_correcting") and not POLICY_LOSSES.trait("luspo", "self_correcting")


FITS = {
    "sapo": (dict(policy_loss="sapo", updates_per_rollout=2), "sapo/gate_weight_mean"),
    "luspo": (dict(objective="luspo", updates_per_rollout=2), "gspo/seq_ratio_mean"),
    "vespo": (dict(objective="vespo", updates_per_rollout=2), "vespo/phi_seq_mean"),
    "bnpo": (dict(loss_aggregation="bnpo"), "clip_ratio/high_mean"),
    "grpo_batch_std": (dict(advantage="grpo_batch_std"), "clip_ratio/high_mean"),
}


@pytest.mark.parametrize("name", list(FITS))
def test_short_fit_through_the_module(name, warm_start_dir, arithmetic_rows):
    """Each name selects its function in `RLModule` and trains two steps (μ = 2: ratios ≠ 1)
    without NaNs, logging the loss's own stat."""
    kwargs, stat = FITS[name]
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-4,
                      generation=dict(max_new_tokens=4, max_prompt_length=8), **kwargs)
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    metrics = trainer.callback_metrics
    assert trainer.global_step == 2 and stat in metrics
    assert all(torch.isfinite(v).all() for v in metrics.values())
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())
    if name == "vespo":  # self-correcting: the module asked its engine for behaviour log-probs, correction off
        assert module.requests.rollout_logprobs and module.hparams.rollout_correction is None


def test_luspo_with_another_aggregation_is_refused_at_construction():
    """luspo's length factor assumes seq-mean-token-mean; token-mean would weigh a sequence by L²."""
    from lightning_rlpt.algorithms.presets import check_objective

    check_objective(resolve_objective("luspo", {}), group_size=4)
    bad = resolve_objective("luspo", {"loss_aggregation": "token-mean"})
    with pytest.raises(ValueError, match=r"'luspo' is made for loss_aggregation='seq-mean-token-mean', not "
                                         r"'token-mean' .*pass loss_aggregation='seq-mean-token-mean' or take "
                                         r"objective='luspo'"):
        check_objective(bad, group_size=4)
