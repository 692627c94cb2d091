"""Prompts refused before a rollout on the HF engine (vLLM refuses them itself): one longer than
the model's context, one whose completion budget would run past the model's positions, and an
empty one with a tokenizer that adds no BOS. Each error names the prompt's dataset index."""
import pytest
from tokenizers import processors

import tiny_task as task
from lightning_rlpt import RLModule

CONTEXT = 64  # the tiny Llama's max_position_embeddings


def module(warm_start_dir, max_new_tokens=4, **kw):
    return RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2,
                    generation=dict(max_new_tokens=max_new_tokens, max_prompt_length=None), **kw)


def sample(m, prompts, indices):
    batch = {"prompt": prompts, "answer": ["2"] * len(prompts), "index": indices}
    return m.sample(batch, m.group_size, m.sampling, seed=0)[0]


def digits(n_tokens):
    """A prompt of ``n_tokens`` tokens with the BOS the tokenizer adds."""
    return "1" * (n_tokens - 1)


def test_a_prompt_longer_than_the_context_is_refused(warm_start_dir):
    m = module(warm_start_dir)  # today: the HF engine generates past position 64 and trains on it
    with pytest.raises(ValueError, match=rf"prompt at dataset index 7 \(row 1 of the batch\) has 81 tokens; with "
                                         rf"max_new_tokens=4 that is 85, beyond the model's context of {CONTEXT} tokens "
                                         r"\(1 such prompt in this batch\).*set max_prompt_length=60"):
        sample(m, ["1+1=", digits(81)], [3, 7])


def test_prompt_plus_max_new_tokens_past_the_positions_is_refused_at_the_boundary(warm_start_dir):
    m = module(warm_start_dir, max_new_tokens=8)
    exp = sample(m, [digits(CONTEXT - 8)], [0])  # 56 + 8 = 64 tokens: fits exactly
    assert exp.completion_ids.shape[0] == 2
    with pytest.raises(ValueError, match=r"dataset index 5 .* has 57 tokens; with max_new_tokens=8 that is 65"):
        sample(m, [digits(CONTEXT - 7)], [5])


def test_validation_rollouts_are_checked_too(warm_start_dir):
    m = module(warm_start_dir)
    batch = {"prompt": [digits(70)], "answer": ["2"], "index": [2]}
    with pytest.raises(ValueError, match="dataset index 2 .* beyond the model's context"):
        m.sample(batch, 1, m.val_sampling, seed=0)


def no_bos_tokenizer():
    tok = task.build_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A")
    assert tok("", add_special_tokens=True)["input_ids"] == []
    return tok


@pytest.mark.parametrize("prompts, indices, row", [
    (["1+2=", ""], [4, 9], 1),  # today: the empty row generates from a fully masked context, silently
    ([""], [9], 0),  # today: an all-empty batch crashes inside generate
])
def test_an_empty_prompt_without_bos_is_refused_naming_the_row(warm_start_dir, prompts, indices, row):
    m = module(warm_start_dir, tokenizer=no_bos_tokenizer())
    with pytest.raises(ValueError, match=rf"prompt at dataset index 9 \(row {row} of the batch\) is '', which gives no "
                                         "tokens: the tokenizer adds no BOS token"):
        sample(m, prompts, indices)


def test_an_empty_prompt_with_bos_is_a_prompt(warm_start_dir):
    exp = sample(module(warm_start_dir), ["", "1+2="], [0, 1])  # BOS alone: unconditional generation
    assert exp.prompt_mask[:2].sum(1).tolist() == [1, 1]
