"""``repetition_penalty`` and ``min_p`` (TRL's names) in `SamplingConfig`, on the HF engine: the
CTRL penalty by hand, batch-invariant (left padding is not a token seen), equal to transformers'
own on unpadded rows, stopping a tiny model's repeats; ``min_p=1`` keeps only the argmax. The
vLLM side is in test_vllm_parity.py. Bad values are refused."""
import pytest
import torch
from transformers import AutoModelForCausalLM

import tiny_task as task
from lightning_rlpt.padding import left_pad
from lightning_rlpt.rollout import HFGenerateEngine, SamplingConfig
from lightning_rlpt.rollout.engine import cut_at_eos
from lightning_rlpt.rollout.hf import RepetitionPenalty

PROMPTS = ["12+34=", "5+6=", "7=", "99+1=", "3+3="]


def greedy(**kwargs):
    return SamplingConfig(max_new_tokens=8, temperature=0.0, **kwargs)


@pytest.fixture(scope="module")
def random_llama(llama_dir):
    """A random tiny Llama: its greedy completions repeat tokens."""
    return AutoModelForCausalLM.from_pretrained(llama_dir).eval()


@pytest.fixture(scope="module")
def prompt_rows():
    return task.build_tokenizer()(PROMPTS)["input_ids"]


def test_penalty_by_hand_skips_left_padding():
    # Row 0: two pad positions (token 2), then 3 and 4. Row 1: no padding; 2 is a real token.
    ids = torch.tensor([[2, 2, 3, 4], [2, 3, 3, 3]])
    scores = torch.tensor([[1.0, 1.0, 6.0, 4.0, -2.0],
                           [1.0, 1.0, 6.0, 4.0, -2.0]])
    out = RepetitionPenalty(2.0, torch.tensor([2, 0]))(ids, scores)
    assert out.tolist() == [[1.0, 1.0, 6.0, 2.0, -4.0],   # 3 and 4 seen: 4 / 2, -2 × 2; pad 2 untouched
                            [1.0, 1.0, 3.0, 2.0, -2.0]]   # 2 and 3 seen, each penalised once


def test_high_penalty_stops_the_repeats_of_a_tiny_model(random_llama, prompt_rows):
    engine = HFGenerateEngine(random_llama, task.EOS_ID, task.PAD_ID)
    plain = engine.generate(prompt_rows, greedy(), 0).completion_ids
    assert any(len(set(c)) < len(c) for c in plain)  # the default repeats
    penalised = engine.generate(prompt_rows, greedy(repetition_penalty=50.0), 0).completion_ids
    for prompt, completion in zip(prompt_rows, penalised):
        assert len(set(completion)) == len(completion)  # no token twice
        assert not set(completion) & set(prompt)  # nor any token of the prompt


@pytest.mark.parametrize("penalty", [1.5, 3.0, 0.8])
def test_penalty_ignores_padding_and_matches_transformers_on_unpadded_rows(random_llama, prompt_rows, penalty):
    """Padding with EOS (as tokenizers whose pad is EOS do): transformers' own processor would
    penalise EOS in the short prompts' rows only; ours gives every row what it gets alone."""
    engine = HFGenerateEngine(random_llama, task.EOS_ID, pad_token_id=task.EOS_ID)
    config = greedy(repetition_penalty=penalty)
    batched = engine.generate(prompt_rows, config, 0).completion_ids
    alone = [engine.generate([row], config, 0).completion_ids[0] for row in prompt_rows]
    assert batched == alone
    reference = []
    for row in prompt_rows:  # transformers' RepetitionPenaltyLogitsProcessor, no padding to count
        out = random_llama.generate(input_ids=torch.tensor([row]), max_new_tokens=8, do_sample=False,
                                    repetition_penalty=penalty, eos_token_id=task.EOS_ID, pad_token_id=task.EOS_ID)
        reference.append(cut_at_eos(out[0, len(row):].tolist(), task.EOS_ID))
    assert batched == reference
    ids, mask = left_pad(prompt_rows, task.EOS_ID)
    out = random_llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                repetition_penalty=penalty, eos_token_id=task.EOS_ID, pad_token_id=task.EOS_ID)
    padded_by_transformers = [cut_at_eos(r, task.EOS_ID) for r in out[:, ids.shape[1]:].tolist()]
    if penalty > 1:  # what the custom processor is for: transformers' own differs on padded rows
        assert padded_by_transformers != reference


def test_a_checkpoints_own_penalty_is_overridden_not_stacked(random_llama, prompt_rows):
    engine = HFGenerateEngine(random_llama, task.EOS_ID, task.PAD_ID)
    plain = engine.generate(prompt_rows, greedy(), 0).completion_ids
    random_llama.generation_config.repetition_penalty = 50.0  # as a checkpoint's generation_config.json may say
    try:
        assert engine.generate(prompt_rows, greedy(), 0).completion_ids == plain
    finally:
        random_llama.generation_config.repetition_penalty = 1.0


def test_min_p_one_samples_the_argmax(random_llama, prompt_rows):
    engine = HFGenerateEngine(random_llama, task.EOS_ID, task.PAD_ID, return_logprobs=True)
    argmax = engine.generate(prompt_rows, greedy(), 0).completion_ids
    sampled = engine.generate(prompt_rows, SamplingConfig(max_new_tokens=8, temperature=1.0), 0).completion_ids
    assert sampled != argmax  # plain sampling at T = 1 wanders off the argmax
    only_max = engine.generate(prompt_rows, SamplingConfig(max_new_tokens=8, temperature=1.0, min_p=1.0), 0)
    assert only_max.completion_ids == argmax
    # The behaviour log-probs are those of the distribution sampled from: one token left, log 1 = 0.
    assert all(lp == 0.0 for row in only_max.logprobs for lp in row)


@pytest.mark.parametrize("kwargs,match", [
    (dict(min_p=-0.1), r"min_p must be in \[0, 1\], 0 disabling it \(got -0.1\)"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\].*0.05-0.1 is usual"),
    (dict(repetition_penalty=0.0), r"repetition_penalty must be > 0, 1 disabling it \(got 0.0\); > 1 discourages"),
    (dict(repetition_penalty=-1.2), r"repetition_penalty must be > 0.*1.05-1.2 is usual"),
])
def test_bad_values_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_distribution_changes_name_what_the_learner_does_not_model():
    assert SamplingConfig().distribution_changes() == []
    assert SamplingConfig(top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.1).distribution_changes() == [
        "top_p=0.9", "top_k=5", "min_p=0.1", "repetition_penalty=1.1"]
    # greedy: truncations cannot change the argmax; a penalty can
    assert SamplingConfig(temperature=0.0, top_p=0.9, min_p=0.1, repetition_penalty=1.1).distribution_changes() == [
        "repetition_penalty=1.1"]


def test_docstring_examples_hold():
    import doctest

    from lightning_rlpt.rollout import hf, sampling

    assert doctest.testmod(hf).failed == 0 and doctest.testmod(sampling).failed == 0
