"""The learner's completion log-probs equal what the sampler used, row by row."""
import pytest
import torch

import task
from lightning_rlpt.collect import to_experience
from lightning_rlpt.logprobs import completion_logprobs
from lightning_rlpt.models import load_policy, load_tokenizer
from lightning_rlpt.rollout import HFGenerateEngine
from lightning_rlpt.sampling import SamplingConfig

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
