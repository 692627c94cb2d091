"""Masking is exact: tool/environment tokens are in the sequence but never in the loss.

Two tests, each of which fails if those tokens entered the loss:

1. Replacement. An episode cut right after an environment observation (model turn, then 25
   environment tokens, nothing after): replacing those 25 tokens by any other tokens leaves the
   policy gradient bit-for-bit unchanged. The control — the same experience with the mask set to
   1 on them — changes the gradient, so the comparison can fail. (Mid-episode observations
   cannot be swapped this way: later model tokens condition on them, as they should.)
2. Per-position. On a whole three-turn episode, the gradient of the loss with respect to the
   final hidden state (hence the logits) at the positions that *predict* environment tokens is exactly zero, and non-zero at
   the positions that predict model tokens: no term of the loss is the log-prob of an
   environment token.
3. The other log-probs. The reference (KL term), old (importance ratio π/π_old) and behaviour
   (TIS/MIS correction, token- and sequence-level) log-probs at environment positions never
   reach the loss: any values there give a bit-identical gradient; the control (the same values
   with the environment tokens in the mask) moves it.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import agent_task as at
from episode_fixtures import tok, env_model_dir  # noqa: F401 (fixtures)
from lightning_rlpt import RLModule
from lightning_rlpt.rollout.episodes.agent import Agent
from lightning_rlpt.rollout.episodes.rollout import rollout_episodes
from lightning_rlpt.rollout.sampling import SamplingConfig

ENV_PROMPT = [{"role": "user", "content": "env"}]


def module_and_episodes(model_dir, tok, **settings):
    module = RLModule(AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                      tokenizer=tok, group_size=2, use_fused_kernel=False, environment=at.CountdownEnv,
                      generation={"max_new_tokens": 40}, **settings)
    sampling = SamplingConfig(max_new_tokens=40, temperature=0.0)
    exp, _ = rollout_episodes(Agent(environment=at.CountdownEnv), module.engine, tok, {"prompt": [ENV_PROMPT]}, 2,
                              sampling, 0, torch.device("cpu"))
    exp.advantages = torch.tensor([1.0, -0.5])
    exp.rewards = exp.scores = torch.tensor([1.0, 0.0])
    return module, exp


def grads(module, exp):
    module.policy.zero_grad()
    loss, _ = module.loss(exp)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in module.policy.parameters() if p.grad is not None])


def cut(exp, width, replace_with=None, mask_env=False):
    out = exp.select([0, 1])
    out.completion_ids = out.completion_ids[:, :width].clone()
    out.completion_mask = out.completion_mask[:, :width].clone()
    out.behaviour_logprobs = None
    env = out.completion_mask == 0
    if replace_with is not None:
        out.completion_ids[env] = replace_with[: int(env.sum())]
    if mask_env:
        out.completion_mask = torch.ones_like(out.completion_mask)
    return out


def test_replacing_trailing_environment_tokens_leaves_the_gradient_unchanged(env_model_dir, tok):
    module, exp = module_and_episodes(env_model_dir, tok)
    assert exp.completion_mask[0, :28].tolist() == [1] * 3 + [0] * 25  # model turn, then one observation
    other = torch.randint(3, len(at.SPECIALS) + len(at.CHARS), (50,), generator=torch.Generator().manual_seed(0))
    base = grads(module, cut(exp, 28))
    swapped = grads(module, cut(exp, 28, replace_with=other))
    assert not torch.equal(cut(exp, 28).completion_ids, cut(exp, 28, replace_with=other).completion_ids)
    assert torch.equal(base, swapped)
    # Control: with the environment tokens in the loss, the same swap moves the gradient.
    assert not torch.allclose(grads(module, cut(exp, 28, mask_env=True)),
                              grads(module, cut(exp, 28, other, mask_env=True)))


def test_no_loss_gradient_at_the_positions_that_predict_environment_tokens(env_model_dir, tok):
    module, exp = module_and_episodes(env_model_dir, tok)
    captured = []

    def keep(_, __, out):
        out.retain_grad()
        captured.append(out)

    handle = module.policy.model.norm.register_forward_hook(keep)  # each position's final hidden state
    try:
        grads(module, exp.select([0, 1]))
    finally:
        handle.remove()
    hidden_grad = captured[-1].grad  # [N, P + C, H]; feeds only its own position's logits
    p = exp.prompt_ids.shape[1]
    # Position p + t - 1 predicts completion token t.
    per_token = hidden_grad[:, p - 1: p - 1 + exp.completion_ids.shape[1]].abs().sum(-1)
    mask = exp.completion_mask.bool()
    assert int((~mask).sum()) == 2 * 50  # two observations of 25 tokens per row
    assert torch.all(per_token[~mask] == 0)
    assert torch.all(per_token[mask] > 0)


def with_logprobs(module, exp, field, at_env, mask_env=False):
    """``exp`` with plausible reference, old and behaviour log-probs on model tokens (each a few
    tenths off the policy's, so KL, ratio and correction are all active) and ``at_env`` in
    ``field`` at every position outside the mask (environment tokens and padding)."""
    out = exp.select([0, 1])
    with torch.no_grad():
        logp, _ = module.policy_logprobs(out)
    offsets = {"ref_logprobs": -0.3, "old_logprobs": 0.2, "behaviour_logprobs": 0.1}
    for name, offset in offsets.items():
        setattr(out, name, logp.float() + offset * torch.linspace(-1, 1, logp.shape[1]))
    values = getattr(out, field)
    values[out.completion_mask == 0] = at_env
    if mask_env:
        out.completion_mask = torch.ones_like(out.completion_mask)
    return out


@pytest.mark.parametrize("field, settings", [
    ("ref_logprobs", dict(kl_coef=0.1, rollout_correction=None)),           # the KL term
    ("old_logprobs", dict(rollout_correction=None)),                        # the importance ratio π/π_old
    ("behaviour_logprobs", dict(rollout_correction="token_tis")),           # per-token correction
    ("behaviour_logprobs", dict(rollout_correction="seq_mis", rollout_correction_cap=2.0)),  # per-sequence
])
def test_log_probs_at_environment_positions_never_reach_the_loss(field, settings, env_model_dir, tok):
    module, exp = module_and_episodes(env_model_dir, tok, **settings)
    assert int((exp.completion_mask == 0).sum()) > 0
    base = grads(module, with_logprobs(module, exp, field, -0.5))
    assert torch.equal(base, grads(module, with_logprobs(module, exp, field, -9.0)))
    # Control: with the environment positions in the mask, the same values move the gradient.
    assert not torch.allclose(grads(module, with_logprobs(module, exp, field, -0.5, mask_env=True)),
                              grads(module, with_logprobs(module, exp, field, -9.0, mask_env=True)))
