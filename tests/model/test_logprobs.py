"""The learner's completion log-probs equal what the sampler used, row by row."""
import pytest
import torch

import tiny_task as task
from lightning_rlpt.rollout.collect import to_experience
from lightning_rlpt.model.logprobs import completion_logprobs
from lightning_rlpt.model.loading import load_policy, load_tokenizer
from lightning_rlpt.rollout import HFGenerateEngine
from lightning_rlpt.rollout.sampling import SamplingConfig

PROMPTS = ["7+5=", "12+34=", "99+99=", "3+4="]  # different lengths: left padding matters


@pytest.mark.parametrize("fixture", ["warm_start_dir", "qwen2_dir"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generate_scores_equal_recomputed_logprobs(request, fixture, temperature):
    path = request.getfixturevalue(fixture)
    tok, policy = load_tokenizer(path, None), load_policy(path)
    engine = HFGenerateEngine(policy, tok.eos_token_id, tok.pad_token_id, return_logprobs=True)
    sampling = SamplingConfig(max_new_tokens=5, temperature=temperature)
    rows = tok(PROMPTS)["input_ids"]
    out = engine.generate(rows, sampling, seed=3)
    exp = to_experience(out, rows, tok, {"prompt": PROMPTS}, 1, sampling, torch.device("cpu"))
    with torch.no_grad():
        logp, entropy = completion_logprobs(policy, exp.input_ids, exp.attention_mask, exp.completion_ids.shape[1],
                                            temperature=temperature, with_entropy=True)
    mask = exp.completion_mask.bool()
    assert torch.allclose(logp[mask], exp.behaviour_logprobs[mask], atol=1e-5)
    assert (entropy[mask] >= 0).all()


def test_same_seed_same_samples_and_global_rng_untouched(warm_start_dir):
    tok, policy = load_tokenizer(warm_start_dir, None), load_policy(warm_start_dir)
    engine = HFGenerateEngine(policy, tok.eos_token_id, tok.pad_token_id)
    rows = tok(PROMPTS)["input_ids"]
    state = torch.get_rng_state()
    a = engine.generate(rows, SamplingConfig(max_new_tokens=4), seed=11).completion_ids
    assert torch.equal(torch.get_rng_state(), state)
    b = engine.generate(rows, SamplingConfig(max_new_tokens=4), seed=11).completion_ids
    c = engine.generate(rows * 4, SamplingConfig(max_new_tokens=4), seed=12).completion_ids
    assert a == b and len(c) == 16


def test_completions_end_at_eos_and_are_decoded(warm_start_dir):
    tok, policy = load_tokenizer(warm_start_dir, None), load_policy(warm_start_dir)
    engine = HFGenerateEngine(policy, tok.eos_token_id, tok.pad_token_id)
    rows = tok(PROMPTS)["input_ids"]
    sampling = SamplingConfig(max_new_tokens=4, temperature=0.0)
    out = engine.generate(rows, sampling, seed=0)
    exp = to_experience(out, rows, tok, {"prompt": PROMPTS}, 1, sampling, torch.device("cpu"))
    for ids, m, text, trunc in zip(exp.completion_ids, exp.completion_mask, exp.completions, exp.truncated):
        real = ids[m.bool()].tolist()
        assert (real[-1] == task.EOS_ID) != bool(trunc)
        assert text == tok.decode([t for t in real if t != task.EOS_ID])


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_lora_on_lm_head_takes_the_fused_path_with_the_same_values_and_gradients(warm_start_dir, dropout,
                                                                                 monkeypatch):
    from peft import LoraConfig, get_peft_model

    from lightning_rlpt.model import logprobs as lp

    kernel, calls = lp._fused(), []
    monkeypatch.setattr(lp, "_fused", lambda: lambda *a, **k: calls.append(1) or kernel(*a, **k))

    torch.manual_seed(0)
    policy = get_peft_model(load_policy(warm_start_dir), LoraConfig(r=4, target_modules=["q_proj", "lm_head"],
                                                                    lora_dropout=dropout, init_lora_weights=False))
    policy.eval()  # how RLModule trains: dropout off, so LoRA on the head is a plain linear map
    head = policy.get_output_embeddings()
    assert lp.head_as_linear(head) is not None and type(head) is not torch.nn.Linear
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [1, 3, 5, 7, 9, 11]])
    mask = torch.ones_like(ids)
    a, b = head.lora_A["default"].weight, head.lora_B["default"].weight
    results = []
    for fused in (True, False):
        logp, ent = completion_logprobs(policy, ids, mask, 3, temperature=0.7, with_entropy=True,
                                        use_fused_kernel=fused)
        grads = torch.autograd.grad(logp.sum(), [a, b])
        results.append((logp.detach(), ent, grads))
    (lf, ef, gf), (lr_, er, gr) = results
    assert len(calls) == 1  # the fused run used the kernel, the plain run did not
    assert torch.allclose(lf, lr_, atol=1e-5) and torch.allclose(ef, er, atol=1e-5)
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(gf, gr))
    head.train()  # active LoRA dropout makes the head stochastic: the fused path steps aside
    assert (lp.head_as_linear(head) is None) == (dropout > 0)


def test_lora_heads_that_are_not_a_plain_linear_map_take_the_plain_path(warm_start_dir):
    from peft import LoraConfig, get_peft_model

    from lightning_rlpt.model.logprobs import head_as_linear

    def head(**lora):
        policy = get_peft_model(load_policy(warm_start_dir), LoraConfig(r=4, target_modules=["lm_head"], **lora))
        return policy.eval(), policy.get_output_embeddings()

    assert head_as_linear(head(lora_bias=True)[1]) is None
    assert head_as_linear(head(use_dora=True)[1]) is None
    policy, lm_head = head(init_lora_weights=False)
    lm_head.merge()
    assert head_as_linear(lm_head)[0] is lm_head.base_layer.weight  # merged: the base weight is the head
    with policy.disable_adapter():
        assert head_as_linear(lm_head) is None  # merged but disabled: peft unmerges, so step aside
