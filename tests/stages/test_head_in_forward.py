"""The head's gradient formed in the forward pass (`stages.head_in_forward`,
`kernels.head_in_forward`) equals the recompute path's: the loss, its metrics, the log-probs and
every parameter's gradient, for every policy loss and aggregation, μ = 1 and μ > 1, with KL and
entropy terms, in fp32 and fp64, over several row chunks; the kernel alone against autograd
through full logits; the fallbacks and the non-finite refusal."""
import logging

import pytest
import torch

import tiny_task as task
from lightning_rlpt import AGGREGATIONS, POLICY_LOSSES, RLModule
from lightning_rlpt.kernels import head_in_forward as kernel
from lightning_rlpt.kernels import head_loss_in_forward, reference_logprobs
from lightning_rlpt.rewards import score_experience
from lightning_rlpt.rollout import collect

GEN = dict(max_new_tokens=6, max_prompt_length=8)
TOL = {torch.float32: (2e-6, 2e-4), torch.float64: (1e-12, 1e-9)}


def _module(model_dir, dtype=torch.float32, **kwargs):
    module = RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, seed=3, generation=GEN, **kwargs)
    module.policy.to(dtype)
    return module


def _experience(module, rows, mu_above_one, kl):
    """A scored rollout with advantages of both signs; μ > 1: old (and behaviour) log-probs that differ
    from the current ones, so ratios move off 1 and clipping acts; KL: reference log-probs alike."""
    batch = dict(prompt=[r["prompt"] for r in rows[:4]], answer=[r["answer"] for r in rows[:4]])
    exp, _ = collect.rollout(module.engine, module.tokenizer, batch, module.group_size, module.sampling, 1, "cpu")
    score_experience(exp, module.rewards)
    g = torch.Generator().manual_seed(0)
    dtype = next(module.policy.parameters()).dtype
    exp.advantages = torch.randn(len(exp), generator=g, dtype=dtype)
    with torch.no_grad():
        logp, _ = module.policy_logprobs(exp)
    shifted = lambda s: (logp + s * torch.randn(logp.shape, generator=g, dtype=logp.dtype)).to(dtype)  # noqa: E731
    exp.behaviour_logprobs = shifted(0.3)
    if mu_above_one:
        exp.old_logprobs = shifted(0.3)
    if kl:
        exp.ref_logprobs = shifted(0.5)
    return exp


def _both_paths(module, exp):
    """(loss, metrics, logp, grads) on the forward-pass path, then the same on the recompute path."""
    out = []
    for mode in ("forward", "recompute"):
        module.head_in_forward.mode = mode
        params = [p for p in module.policy.parameters() if p.requires_grad]
        loss, metrics, logp = module.loss_and_logprobs(exp)
        assert (type(loss.grad_fn).__name__ == "_InjectedBackward") == (mode == "forward")  # the path taken
        out.append((loss, metrics, logp, torch.autograd.grad(loss, params)))
    return out


def _assert_same(forward, recompute, dtype):
    atol, rtol = TOL[dtype]
    (l1, m1, p1, g1), (l2, m2, p2, g2) = forward, recompute
    assert torch.allclose(l1, l2, atol=atol, rtol=rtol), (l1.item(), l2.item())
    assert m1.keys() == m2.keys()
    for key in m1:  # metrics are float32 sums (`token_mean`) whatever the dtype
        assert m1[key] == pytest.approx(m2[key], rel=2e-5, abs=1e-7), key
    assert torch.allclose(p1, p2.to(p1.dtype), atol=atol, rtol=rtol)
    assert max(g.abs().max().item() for g in g2) > 1e-4  # the gradients compared are not all zero
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=atol, rtol=rtol), (a - b).abs().max().item()


@pytest.fixture
def three_row_chunks(monkeypatch):
    """Chunks of 3 rows (the 16 rows of a rollout: 6 chunks, the last one short)."""
    monkeypatch.setattr(kernel, "BUDGET_BYTES", 3 * GEN["max_new_tokens"] * (len(task.SPECIALS) + len(task.SYMBOLS)) * 4)


@pytest.mark.parametrize("policy_loss", POLICY_LOSSES.names())
@pytest.mark.parametrize("mu_above_one", [False, True])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.05], ids=["no-entropy-bonus", "entropy-bonus"])
def test_every_policy_loss_matches_the_recompute_path(warm_start_dir, arithmetic_rows, three_row_chunks,
                                                      policy_loss, mu_above_one, entropy_coef):
    """With and without an entropy bonus: without one, the kernel takes its multiply-only branch."""
    module = _module(warm_start_dir, policy_loss=policy_loss, kl_coef=0.2, entropy_coef=entropy_coef)
    exp = _experience(module, arithmetic_rows, mu_above_one, kl=True)
    _assert_same(*_both_paths(module, exp), torch.float32)


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_aggregation_matches_in_fp32_and_fp64(warm_start_dir, arithmetic_rows, three_row_chunks,
                                                    aggregation, dtype):
    module = _module(warm_start_dir, dtype, loss_aggregation=aggregation, kl_coef=0.1, entropy_coef=0.02)
    exp = _experience(module, arithmetic_rows, mu_above_one=True, kl=True)
    _assert_same(*_both_paths(module, exp), dtype)


def test_lora_head_and_no_kl_no_entropy_match(warm_start_dir, arithmetic_rows, three_row_chunks):
    """A LoRA on the head: its gradient reaches the adapters through the effective weight."""
    module = _module(warm_start_dir, lora=dict(r=4, lora_alpha=8, target_modules="all-linear"))
    exp = _experience(module, arithmetic_rows, mu_above_one=False, kl=False)
    forward, recompute = _both_paths(module, exp)
    _assert_same(forward, recompute, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("sub_rows", [2, 32])
def test_kernel_matches_autograd_through_full_logits(monkeypatch, dtype, rows, sub_rows):
    """Elementwise passes over sub-blocks of 2 rows and over the whole chunk; bias, a temperature, a loss in log-probs and entropies that mixes rows' values only through
    global constants; the head and decoder gradients and the loss against the naive path."""
    monkeypatch.setattr(kernel, "SUB_ROWS", sub_rows)
    g = torch.Generator().manual_seed(1)
    n, c, h, v, temp = 5, 3, 16, 97, 0.7
    hidden = torch.randn(n, c, h, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, generator=g, dtype=dtype, requires_grad=True)
    bias = torch.randn(v, generator=g, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, v, (n, c), generator=g)
    adv, mask = torch.randn(n, 1, generator=g, dtype=dtype), (torch.rand(n, c, generator=g) > 0.2).to(dtype)

    def objective(span, logp, entropy):
        ratio = (logp - logp.detach() * 0.9).exp()
        return ((-ratio * adv[span] - 0.1 * entropy + 0.05 * logp ** 2) * mask[span]).sum() / mask.sum(), None

    loss, logp, ent, _ = head_loss_in_forward(hidden, weight, bias, targets, temp, objective, rows)
    got = torch.autograd.grad(loss, [hidden, weight, bias])
    ref_logp, ref_ent = reference_logprobs(hidden, weight, targets, bias=bias, temperature=temp)
    ref_loss = objective(slice(0, n), ref_logp, ref_ent)[0]
    want = torch.autograd.grad(ref_loss, [hidden, weight, bias])
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(loss, ref_loss, atol=atol)
    assert torch.allclose(logp, ref_logp.detach(), atol=atol) and torch.allclose(ent, ref_ent.detach(), atol=atol)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=atol, rtol=1e-4), (a - b).abs().max().item()


def test_a_non_finite_gradient_stops_naming_the_rows():
    hidden, weight = torch.randn(4, 2, 8, requires_grad=True), torch.randn(11, 8, requires_grad=True)
    targets = torch.zeros(4, 2, dtype=torch.long)

    def objective(span, logp, entropy):
        scale = torch.full_like(logp, float("nan")) if span.start == 2 else torch.ones_like(logp)
        return (logp * scale).sum(), None

    with pytest.raises(FloatingPointError, match="rows 2..3"):
        head_loss_in_forward(hidden, weight, None, targets, 1.0, objective, 2)


def test_paths_that_cannot_take_it_fall_back_and_say_so_once(warm_start_dir, arithmetic_rows, caplog):
    """top_entropy_quantile < 1 in one pass needs every entropy first: the recompute path, said once."""
    module = _module(warm_start_dir, top_entropy_quantile=0.5)
    exp = _experience(module, arithmetic_rows, mu_above_one=False, kl=False)
    with caplog.at_level(logging.INFO, logger="lightning_rlpt.stages.head_in_forward"):
        module.loss_and_logprobs(exp)
        module.loss_and_logprobs(exp)
    said = [r for r in caplog.records if "recomputed in the backward" in r.getMessage()]
    assert len(said) == 1 and "top_entropy_quantile" in said[0].getMessage()
    with pytest.raises(ValueError, match="head_gradient='backward'"):
        _module(warm_start_dir, head_gradient="backward")


def test_auto_takes_the_forward_path_on_cpu_and_recomputes_elsewhere(warm_start_dir, arithmetic_rows, caplog):
    module = _module(warm_start_dir)
    assert module.head_in_forward.mode == "auto"
    exp = _experience(module, arithmetic_rows, mu_above_one=False, kl=False)
    assert type(module.loss_and_logprobs(exp)[0].grad_fn).__name__ == "_InjectedBackward"
    with caplog.at_level(logging.INFO, logger="lightning_rlpt.stages.head_in_forward"):
        assert not module.head_in_forward.eligible(type("OnGPU", (), {"device": torch.device("cuda")})(), exp)
    assert "head_gradient='auto' on cuda" in caplog.text


def test_a_bf16_head_weight_takes_the_recompute_path(warm_start_dir, arithmetic_rows, caplog):
    """A float32 copy of a bf16 head would cost 4·V·H bytes: the tile-by-tile recompute path instead."""
    module = _module(warm_start_dir)
    exp = _experience(module, arithmetic_rows, mu_above_one=False, kl=False)
    module.policy.to(torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="lightning_rlpt.stages.head_in_forward"):
        loss = module.loss_and_logprobs(exp)[0]
    assert type(loss.grad_fn).__name__ != "_InjectedBackward"
    assert any("torch.bfloat16" in r.getMessage() for r in caplog.records)


def test_the_injected_gradients_are_freed_by_the_backward_and_cannot_be_differentiated_again():
    """The loss holds d hidden and d W ([V, H]) until its backward, not until it is dropped (the
    next micro-batch's forward would otherwise run beside them); a second backward, or a backward
    through the gradient (second order), is refused rather than answered with dropped terms."""
    hidden, weight = torch.randn(2, 3, 8, requires_grad=True), torch.randn(11, 8, requires_grad=True)
    targets = torch.zeros(2, 3, dtype=torch.long)
    loss = head_loss_in_forward(hidden, weight, None, targets, 1.0, lambda s, lp, e: (-lp.sum(), None), 1)[0]
    assert loss.grad_fn.grads[1].shape == (11, 8)
    loss.backward(retain_graph=True)
    assert loss.grad_fn.grads is None and weight.grad is not None
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
    loss = head_loss_in_forward(hidden, weight, None, targets, 1.0, lambda s, lp, e: (-lp.sum(), None), 1)[0]
    (g,) = torch.autograd.grad(loss, hidden, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


def test_the_budget_counts_float64_logits_as_eight_bytes():
    assert kernel.rows_per_chunk(32, 32000) == 2 * kernel.rows_per_chunk(32, 32000, itemsize=8) == 8


def test_a_completion_over_the_budget_recomputes_said_once_whatever_its_width(warm_start_dir, arithmetic_rows,
                                                                              monkeypatch, caplog):
    module = _module(warm_start_dir)
    exp = _experience(module, arithmetic_rows, mu_above_one=False, kl=False)
    monkeypatch.setattr(kernel, "BUDGET_BYTES", 15 * 4)  # one token of the 15-symbol vocabulary
    with caplog.at_level(logging.INFO, logger="lightning_rlpt.stages.head_in_forward"):
        for batch in (exp, _narrow(exp)):  # two widths, one reason
            loss = module.loss_and_logprobs(batch)[0]
            assert type(loss.grad_fn).__name__ != "_InjectedBackward"
    said = [r.getMessage() for r in caplog.records if "recomputed" in r.getMessage()]
    assert len(said) == 1 and "a completion over 1 tokens" in said[0]


def _narrow(exp):
    """The experience with its completions cut to 2 tokens."""
    out = exp.select(list(range(len(exp))))
    out.completion_ids, out.completion_mask = out.completion_ids[:, :2], out.completion_mask[:, :2]
    for name in ("behaviour_logprobs", "old_logprobs", "ref_logprobs"):
        if getattr(out, name) is not None:
            setattr(out, name, getattr(out, name)[:, :2])
    return out


def test_an_overridden_policy_logprobs_is_called(warm_start_dir, arithmetic_rows):
    """The forward-pass path runs the decoder and head itself: a subclass's or an instance's
    policy_logprobs (the parity tests feed a peer's log-probs through it) takes the recompute path."""
    module = _module(warm_start_dir)
    exp = _experience(module, arithmetic_rows, mu_above_one=False, kl=False)
    calls = []
    original = module.policy_logprobs
    module.policy_logprobs = lambda *a, **k: calls.append(1) or original(*a, **k)
    module.loss_and_logprobs(exp)
    assert calls == [1]

    class Sub(RLModule):
        def policy_logprobs(self, *a, **k):
            calls.append(2)
            return super().policy_logprobs(*a, **k)

    sub = Sub(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, seed=3, generation=GEN)
    sub.loss_and_logprobs(exp)
    assert calls == [1, 2]


def _drop(term):
    """`row_coefficients` as the forward-pass kernel sees it, with one term of
    ``dz = g·onehot − p·(g + g_ent·(log p + H))`` left out."""
    from lightning_rlpt.kernels.chunked import row_coefficients

    def coefficients(g_lp, g_ent, entropy, valid, cdt):
        g, g_e, coef_a = row_coefficients(g_lp, g_ent, entropy, valid, cdt)
        if term == "one-hot":
            return torch.zeros_like(g), g_e, coef_a
        if term == "p·g":
            return g, g_e, coef_a + g
        if term == "p·g_ent·log p":
            return g, None, coef_a
        return g, g_e, -g  # "p·g_ent·H"
    return coefficients


@pytest.mark.parametrize("policy_loss", POLICY_LOSSES.names())
@pytest.mark.parametrize("term", ["one-hot", "p·g", "p·g_ent·log p", "p·g_ent·H"])
def test_the_equality_fails_when_one_term_is_dropped(warm_start_dir, arithmetic_rows, three_row_chunks, monkeypatch,
                                                     policy_loss, term):
    """The equality above can fail: with one term of the logits' gradient left out of the
    forward-pass kernel, every loss type's gradients differ from the recompute path's."""
    module = _module(warm_start_dir, policy_loss=policy_loss, kl_coef=0.2, entropy_coef=0.05)
    exp = _experience(module, arithmetic_rows, mu_above_one=True, kl=True)
    monkeypatch.setattr(kernel, "row_coefficients", _drop(term))
    forward, recompute = _both_paths(module, exp)
    with pytest.raises(AssertionError):
        _assert_same(forward, recompute, torch.float32)
