"""The policy-loss zoo and future-KL: values and gradients against hand computations, bad input,
presets, and one short fit per objective on the arithmetic demo."""
import itertools
import math

import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import KL_ESTIMATORS, POLICY_LOSSES, HFGenerateEngine, PromptDataModule, RLModule
from lightning_rlpt.algorithms.aggregation import aggregate_loss
from lightning_rlpt.algorithms.presets import PRESETS, check_objective, resolve_objective


def run(name, delta, adv, mask, **kw):
    """Loss and d(Σ mask·loss)/d logπ for log-ratios ``delta`` (old = 0)."""
    logp = torch.tensor(delta, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(mask, dtype=torch.float64)
    loss, stats = POLICY_LOSSES.get(name)(logp, torch.zeros_like(logp), torch.tensor(adv, dtype=torch.float64),
                                          mask, **kw)
    (loss * mask).sum().backward()
    return loss.detach(), logp.grad, stats


def close(a, b):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=1e-9)


# ---------------------------------------------------------------- GSPO
def test_gspo_sequence_ratio_clip_and_mask():
    delta = [[0.1, 0.2, 0.3], [-0.1, 0.05, 7.0]]  # row 1: last slot is padding (its 7.0 must not count)
    mask = [[1, 1, 1], [1, 1, 0]]
    loss, grad, stats = run("gspo", delta, [1.0, -2.0], mask, clip_low=0.2, clip_high=0.2)
    s0, s1 = math.exp(0.2), math.exp(-0.025)  # length-normalised sequence ratios
    assert s0 > 1.2 and 0.8 < s1 < 1.2
    assert close(loss[0], [-1.2] * 3) and close(grad[0], [0.0] * 3)  # clipped high: no gradient
    assert close(loss[1, :2], [2 * s1] * 2) and close(grad[1], [2 * s1, 2 * s1, 0.0])
    assert close(stats["clip_ratio/high"], [1, 0])  # one decision per sequence (logged as a mean over sequences)
    assert close(stats["gspo/seq_ratio"][1], s1)


def test_gspo_seq_mean_token_mean_gives_the_sequence_gradient():
    """GSPO's ∇ = -A s_i (1/|y_i|) Σ_t ∇logπ_t: per token -A s_i/|y_i| (then /N sequences)."""
    logp = torch.tensor([[0.01, -0.02, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.5, -1.0], dtype=torch.float64)
    loss, _ = POLICY_LOSSES.get("gspo")(logp, torch.zeros_like(logp), adv, mask, clip_low=0.2, clip_high=0.2)
    aggregate_loss(loss, mask, "seq-mean-token-mean").backward()
    s0 = math.exp((0.01 - 0.02) / 3)
    assert close(logp.grad, [[-1.5 * s0 / 3 / 2] * 3, [1.0 / 2, 0, 0]])


def test_gspo_preset_has_the_papers_ranges():
    cfg = resolve_objective("gspo", {})
    assert (cfg.policy_loss, cfg.clip_low, cfg.clip_high, cfg.loss_aggregation) == \
        ("gspo", 3e-4, 4e-4, "seq-mean-token-mean")
    _, grad, stats = run("gspo", [[5e-4]], [1.0], [[1]], clip_low=3e-4, clip_high=4e-4)
    assert grad.item() == 0 and stats["clip_ratio/high"].item() == 1


# ---------------------------------------------------------------- CTPO
def ctpo_expected(delta, adv, lo_c=0.025, hi_c=0.05, dual_c=0.05, cap=10.0):
    """Loop over tokens: cumulative log-ratio, sqrt(t) log-space clip, dual clip for A < 0."""
    values, grads, cum = [], [], 0.0
    for t, d in enumerate(delta, start=1):
        cum += d
        lr = min(cum, cap)
        lo, hi = -lo_c * math.sqrt(t), hi_c * math.sqrt(t)
        unclipped, clipped = -adv * math.exp(lr), -adv * math.exp(min(max(lr, lo), hi))
        value = max(unclipped, clipped)
        grad = -adv * math.exp(lr) if unclipped >= clipped else 0.0  # the clipped branch has no gradient
        if adv < 0 and value > -adv * math.exp(dual_c * math.sqrt(t)):
            value, grad = -adv * math.exp(dual_c * math.sqrt(t)), 0.0
        values.append(value)
        grads.append(grad)
    return values, grads


@pytest.mark.parametrize("delta,adv", [([0.01, 0.02, -0.05, 0.3], 1.0), ([-0.03, 0.0, 0.0, 0.5], -1.0)])
def test_ctpo_cumulative_ratio_position_clip_and_dual_clip(delta, adv):
    loss, grad, stats = run("ctpo", [delta], [adv], [[1, 1, 1, 1]])
    want_v, want_g = ctpo_expected(delta, adv)
    assert close(loss[0], want_v) and close(grad[0], want_g)
    if adv > 0:  # 0.28 > 0.05·√4: the last token is clipped high, the others pass
        assert stats["clip_ratio/high"][0].tolist() == [0, 0, 0, 1]
    else:  # t=1: -0.03 < -0.025 clipped low; t=4: 0.47 capped by the dual clip exp(0.05·2)
        assert stats["clip_ratio/low"][0].tolist() == [1, 0, 0, 0]
        assert stats["clip_ratio/dual"][0].tolist() == [0, 0, 0, 1]
        assert loss[0, 3].item() == pytest.approx(math.exp(0.1))


def test_ctpo_caps_the_cumulative_log_ratio():
    loss, grad, _ = run("ctpo", [[12.0]], [-1.0], [[1]], dual_clip_coef=100.0)
    assert loss.item() == pytest.approx(math.exp(10.0)) and grad.item() == pytest.approx(math.exp(10.0))


def test_ctpo_padding_does_not_enter_the_cumulative_sum():
    loss, _, _ = run("ctpo", [[0.01, 0.02], [0.01, 9.0]], [1.0, 1.0], [[1, 1], [1, 0]])
    assert close(loss[1, 0], loss[0, 0])


# ---------------------------------------------------------------- MinPRO
@pytest.mark.parametrize("include_current,weights", [
    (False, [1.0, math.exp(0.1), math.exp(-0.2)]),
    (True, [math.exp(0.1), math.exp(-0.2), math.exp(-0.2)]),
])
def test_minpro_prefix_minimum_weights(include_current, weights):
    delta = [0.1, -0.2, 0.05]
    loss, grad, stats = run("minpro", [delta + [-5.0]], [1.0], [[1, 1, 1, 0]], include_current=include_current)
    ratios = [math.exp(d) for d in delta]  # all inside [0.8, 1.2]: PPO leaves them unclipped
    assert close(loss[0, :3], [-w * r for w, r in zip(weights, ratios)])
    assert close(grad[0, :3], [-w * r for w, r in zip(weights, ratios)])
    assert stats["minpro/prefix_weight"][0, 3].item() == 1.0  # padding: neutral weight, never NaN


def test_minpro_keeps_the_token_clip():
    _, grad, stats = run("minpro", [[0.0, 0.5]], [1.0], [[1, 1]])  # exp(0.5) > 1.2 with A > 0
    assert grad[0, 1].item() == 0 and stats["clip_ratio/high"][0, 1].item() == 1


# ---------------------------------------------------------------- CISPO, RGRA
def test_cispo_detached_truncated_weight():
    delta = [[math.log(1.5), math.log(0.5), math.log(1.1)]]
    loss, grad, stats = run("cispo", delta, [[1.0, -1.0, 2.0]], [[1, 1, 1]], clip_high=0.28)
    # weights 1.28 (truncated), 0.5 (no lower bound by default), 1.1
    assert close(loss[0], [-1.0 * 1.28 * delta[0][0], 0.5 * delta[0][1], -2.0 * 1.1 * delta[0][2]])
    assert close(grad[0], [-1.28, 0.5, -2.2])  # -w·A: every token keeps its gradient
    assert stats["clip_ratio/high"][0].tolist() == [1, 0, 0]
    _, grad, stats = run("cispo", delta, [[1.0, -1.0, 2.0]], [[1, 1, 1]], clip_low=0.2, clip_lower=True)
    assert grad[0, 1].item() == pytest.approx(0.8) and stats["clip_ratio/low"][0].tolist() == [0, 1, 0]


@pytest.mark.parametrize("name", ["rgra", "reinforce"])
def test_rgra_is_plain_reinforce(name):
    loss, grad, stats = run(name, [[-0.5, -2.0]], [[3.0, -1.0]], [[1, 1]])
    assert close(loss, [[1.5, -2.0]]) and close(grad, [[-3.0, 1.0]]) and stats == {}


# ---------------------------------------------------------------- decoupled PPO / A-3PO
def decoupled(staleness, logp=0.3, adv=1.0, **kw):
    lp = torch.tensor([[logp]], dtype=torch.float64, requires_grad=True)
    behav = torch.zeros(1, 1, dtype=torch.float64)
    old = torch.full((1, 1), 0.1, dtype=torch.float64)
    loss, stats = POLICY_LOSSES.get("decoupled_ppo")(lp, old, torch.tensor([adv], dtype=torch.float64),
                                                     torch.ones(1, 1, dtype=torch.float64),
                                                     behaviour_logprobs=behav, staleness=staleness, **kw)
    loss.sum().backward()
    return loss.item(), lp.grad.item(), stats


def test_a3po_interpolates_the_proximal_policy_from_versions():
    # staleness 3, lag 1: alpha = 2/3, log prox = 0.2, r = e^0.1 (inside 1 ± 0.2), weight e^0.2
    value, grad, stats = decoupled(3)
    w, r = math.exp(0.2), math.exp(0.1)
    assert value == pytest.approx(-w * r) and grad == pytest.approx(-w * r)
    assert stats["decoupled/behaviour_weight"].item() == pytest.approx(w)


@pytest.mark.parametrize("staleness", [0, 1])
def test_a3po_fresh_rollout_uses_the_behaviour_policy(staleness):
    value, grad, stats = decoupled(staleness)  # alpha = 0: r = e^0.3 > 1.2, clipped
    assert value == pytest.approx(-1.2) and grad == 0.0
    assert stats["decoupled/behaviour_weight"].item() == 1.0


def test_decoupled_recomputed_proximal_and_weight_cap():
    value, grad, _ = decoupled(3, proximal="recomputed")  # prox = old = 0.1: r = e^0.2 > 1.2 clipped
    assert value == pytest.approx(-1.2 * math.exp(0.1)) and grad == 0.0
    value, _, _ = decoupled(3, behaviour_weight_cap=1.1)  # weight e^0.2 > 1.1: token dropped
    assert value == 0.0


def test_a3po_per_sequence_staleness():
    lp = torch.tensor([[0.3], [0.3]], dtype=torch.float64)
    loss, stats = POLICY_LOSSES.get("decoupled_ppo")(lp, lp, torch.ones(2, dtype=torch.float64),
                                                     torch.ones(2, 1, dtype=torch.float64),
                                                     behaviour_logprobs=torch.zeros(2, 1, dtype=torch.float64),
                                                     staleness=torch.tensor([1, 3]))
    assert close(stats["decoupled/behaviour_weight"][:, 0], [1.0, math.exp(0.2)])


def test_decoupled_ppo_without_behaviour_logprobs_says_what_to_add():
    lp = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="VLLMRollout"):
        POLICY_LOSSES.get("decoupled_ppo")(lp, lp, torch.ones(1), torch.ones(1, 1), behaviour_logprobs=None)
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        decoupled(-1)


# ---------------------------------------------------------------- future-KL
def test_future_k1_value_is_the_masked_return_to_go():
    logp = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[0.0, 0.0, 0.0, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    loss = KL_ESTIMATORS.get("future_k1")(logp, ref, logp.detach(), mask)
    assert close(loss[0, :3], [0.6, 0.5, 0.3])  # padding's δ = 9.4 is not in any return-to-go
    (loss * mask).sum().backward()
    assert close(logp.grad[0, :3], [0.6, 0.5, 0.3])


def test_future_k1_is_the_exact_sequence_reverse_kl_gradient():
    """Two-token autoregressive policy over 3 symbols, every sequence enumerated: Σ_y π(y)∇L(y)
    equals ∇ KL(π(y)‖π_ref(y)); the per-token k1 does not."""
    torch.manual_seed(0)
    v = 3
    theta1, theta2 = torch.randn(v, dtype=torch.float64), torch.randn(v, v, dtype=torch.float64)
    ref1, ref2 = torch.randn(v, dtype=torch.float64).log_softmax(-1), torch.randn(v, v, dtype=torch.float64).log_softmax(-1)

    def expected_grad(name):
        t1, t2 = theta1.clone().requires_grad_(True), theta2.clone().requires_grad_(True)
        lp1, lp2 = t1.log_softmax(-1), t2.log_softmax(-1)
        total = 0.0
        for a, b in itertools.product(range(v), range(v)):
            logp = torch.stack([lp1[a], lp2[a, b]]).unsqueeze(0)
            ref = torch.stack([ref1[a], ref2[a, b]]).unsqueeze(0)
            weight = (lp1[a] + lp2[a, b]).exp().detach()
            total = total + weight * KL_ESTIMATORS.get(name)(logp, ref, logp.detach(), torch.ones(1, 2)).sum()
        total.backward()
        return torch.cat([t1.grad, t2.grad.flatten()])

    t1, t2 = theta1.clone().requires_grad_(True), theta2.clone().requires_grad_(True)
    lp1, lp2 = t1.log_softmax(-1), t2.log_softmax(-1)
    kl = sum((lp1[a] + lp2[a, b]).exp() * (lp1[a] + lp2[a, b] - ref1[a] - ref2[a, b])
             for a, b in itertools.product(range(v), range(v)))
    kl.backward()
    exact = torch.cat([t1.grad, t2.grad.flatten()])
    assert torch.allclose(expected_grad("future_k1"), exact, atol=1e-12)
    assert not torch.allclose(expected_grad("k1"), exact, atol=1e-3)


# ---------------------------------------------------------------- check_objective
def check_pair(policy_loss, advantage, group_size=4, **kwargs):
    """A loss / estimator pair selected as RLModule selects it, then checked with the run's settings."""
    objective = resolve_objective("grpo", {"policy_loss": policy_loss, "advantage": advantage})
    check_objective(objective, group_size=group_size, **kwargs)


@pytest.mark.parametrize("args,kwargs,match", [
    (("ppo_clip", "passk"), dict(group_size=4, advantage_kwargs={"k": 8}), "k <= group_size"),
    (("ppo_clip", "qae"), dict(advantage_kwargs={"quantile": 1.0}), "between 0 and 1"),
    (("ppo_clip", "qae"), dict(group_size=1), "group_size >= 2"),
    (("ppo_clip", "passk"), dict(group_size=1), "group_size >= 2"),
    (("ppo_clip", "reinforce_pp"), dict(group_size=1, advantage_kwargs={"group_baseline": True}), "group_baseline"),
    (("decoupled_ppo", "grpo"), dict(rollout_correction="token_tis"), "rollout_correction=None"),
    (("rgra", "grpo"), dict(updates_per_rollout=2), "no importance ratio"),
    (("nope", "grpo"), {}, "unknown policy loss"),
])
def test_check_pair_refuses_meaningless_combinations(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_pair(*args, **kwargs)


def test_check_pair_accepts_valid_combinations():
    check_pair("gspo", "passk", group_size=4, advantage_kwargs={"k": 4})
    check_pair("ppo_clip", "reinforce_pp", group_size=1)
    check_pair("decoupled_ppo", "grpo", group_size=4, rollout_correction=None)
    check_pair("rgra", "rloo", group_size=2, updates_per_rollout=1)


def test_presets_resolve():
    for name in ("gspo", "cispo", "ctpo"):
        cfg = resolve_objective(name, {})
        assert cfg.policy_loss == name and cfg.kl_coef == 0.0
    assert PRESETS["ctpo"]["clip_low"] == 0.025 and PRESETS["cispo"]["clip_high"] == 0.28


# ---------------------------------------------------------------- short fits
FITS = {
    "gspo": dict(objective="gspo", updates_per_rollout=2),
    "cispo": dict(objective="cispo", updates_per_rollout=2),
    "ctpo": dict(objective="ctpo", updates_per_rollout=2),
    "minpro": dict(objective="minpro", updates_per_rollout=2),
    "rgra": dict(objective="rgra", kl_coef=0.0),
    "decoupled_ppo": dict(objective="decoupled_ppo", rollout_correction=None),
    "reinforce_pp": dict(advantage="reinforce_pp", advantage_kwargs={"group_baseline": True}),
    "qae": dict(advantage="qae"),
    "passk": dict(advantage="passk", advantage_kwargs={"k": 2}),
    "future_k1": dict(kl_coef=0.05, kl_estimator="future_k1", loss_aggregation="seq-mean-token-sum"),
}


@pytest.mark.parametrize("name", list(FITS))
def test_short_fit_without_nans(name, warm_start_dir, arithmetic_rows):
    kwargs = dict(FITS[name])
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-4,
                      generation=dict(max_new_tokens=4, max_prompt_length=8), **kwargs)
    if name == "decoupled_ppo":
        module.rollout_engine = HFGenerateEngine(module.policy, module.tokenizer.eos_token_id,
                                                 module.tokenizer.pad_token_id, return_logprobs=True)
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert trainer.global_step == 2
    metrics = trainer.callback_metrics
    assert "loss" in metrics and all(torch.isfinite(v).all() for v in metrics.values())
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())
    if name == "decoupled_ppo":
        assert "decoupled/behaviour_weight_mean" in metrics
