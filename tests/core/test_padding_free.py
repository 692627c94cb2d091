"""padding_free: the policy and reference forwards run on one packed row per micro-batch (real
tokens only, position ids restarting per sequence). Log-probs, entropies and gradients equal the
padded path's, for Llama and Qwen2, sdpa and eager, fused and plain heads, full fine-tuning and
LoRA, with KL and micro-batches; the token budget counts real tokens; attention that cannot keep
packed sequences apart is refused at construction."""
import functools

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import tiny_task as task
from lightning_rlpt import RLModule
from lightning_rlpt.batching import MicroBatching, span_mask
from lightning_rlpt.experience import Experience
from lightning_rlpt.model.logprobs import completion_logprobs, pack
from test_micro_batches import _assert_same, _grads

# fp32: the packed forward runs the same matmuls over another row layout (measured ≤ 3e-7 on
# log-probs of this size; gradients compared at the micro-batch tests' tolerance).
ATOL = 1e-5
PROMPTS = [3, 5, 1, 4]        # real prompt tokens per row (left-padded to 5)
COMPLETIONS = [4, 2, 6, 1]    # real completion tokens per row (right-padded to 6)


def _qwen2(seed: int = 0):
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=15, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                        max_position_embeddings=64, tie_word_embeddings=True))


def _batch():
    gen = torch.Generator().manual_seed(0)
    width_p, width_c = max(PROMPTS), max(COMPLETIONS)
    ids = torch.randint(3, 15, (len(PROMPTS), width_p + width_c), generator=gen)
    mask = torch.zeros_like(ids)
    for row, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS)):
        mask[row, width_p - p: width_p + c] = 1
    ids = ids * mask  # padding is token 0 on both sides
    loss_mask = mask[:, width_p:].float()
    return ids, mask, width_c, loss_mask


def _logprobs_and_grads(model, padding_free, fused):
    ids, mask, width_c, loss_mask = _batch()
    model.zero_grad()
    logp, entropy = completion_logprobs(model, ids, mask, width_c, temperature=0.7, with_entropy=True,
                                        use_fused_kernel=fused, padding_free=padding_free)
    (logp * loss_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    keep = loss_mask.bool()
    return logp.detach()[keep], entropy[keep], grads


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("fused", [True, False])
def test_packed_logprobs_entropies_and_gradients_equal_the_padded_ones(family, attn, fused):
    model = task.build_model(seed=1) if family == "llama" else _qwen2(seed=1)
    model.set_attn_implementation(attn)
    model.train()
    padded = _logprobs_and_grads(model, padding_free=False, fused=fused)
    packed = _logprobs_and_grads(model, padding_free=True, fused=fused)
    assert torch.allclose(packed[0], padded[0], atol=ATOL), (packed[0] - padded[0]).abs().max().item()
    assert torch.allclose(packed[1], padded[1], atol=ATOL)
    assert padded[2].keys() == packed[2].keys() and padded[2]
    for name in padded[2]:
        assert torch.allclose(packed[2][name], padded[2][name], atol=ATOL), name


def test_the_packed_row_holds_only_real_tokens():
    ids, mask, width_c, _ = _batch()
    inputs, keep = pack(ids, mask, width_c)
    assert inputs["input_ids"].shape == (1, sum(PROMPTS) + sum(COMPLETIONS))
    assert (inputs["input_ids"] != 0).all()
    assert inputs["position_ids"][0].tolist() == [i for n in map(sum, zip(PROMPTS, COMPLETIONS)) for i in range(n)]
    assert "attention_mask" not in inputs and inputs["use_cache"] is False
    # Row 1's first completion token (index 0 of its completion) is predicted by its last prompt token.
    assert keep[1, 0].item() == PROMPTS[0] + COMPLETIONS[0] + PROMPTS[1] - 1


def _experience(prompts, completions):
    width_p, width_c = max(prompts), max(completions)
    n = len(prompts)
    prompt_mask = torch.stack([torch.arange(width_p) >= width_p - p for p in prompts]).long()
    completion_mask = torch.stack([torch.arange(width_c) < c for c in completions]).float()
    return Experience(prompt_ids=prompt_mask.clone(), prompt_mask=prompt_mask,
                      completion_ids=completion_mask.long(), completion_mask=completion_mask,
                      group_ids=torch.arange(n), group_size=1, prompts=[""] * n, completions=[""] * n, columns={},
                      truncated=torch.zeros(n, dtype=torch.bool))


def test_the_token_budget_counts_real_tokens_when_padding_free():
    # Lengths 10, 9, 3, 2 (prompt + completion), budget 12. Padded, a micro-batch costs
    # rows × its widest prompt + widest completion: {10}, {9}, {3, 2} (2 × (2 + 1) = 6).
    # Packed it costs the sum of lengths: {10}, {9, 3} (12), {2}.
    exp = _experience([6, 5, 2, 1], [4, 4, 1, 1])
    padded = MicroBatching(max_tokens_per_micro_batch=12).split(exp)
    packed = MicroBatching(max_tokens_per_micro_batch=12, padding_free=True).split(exp)
    assert [r.tolist() for r in padded] == [[0], [1], [2, 3]]
    assert [r.tolist() for r in packed] == [[0], [1, 2], [3]]


def test_span_mask_stops_at_the_last_trained_token():
    exp = _experience([2, 1], [3, 1])
    exp.completion_mask[0, 1] = 0  # a hole (a masked token inside the completion) is still seen
    assert span_mask(exp).tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]


@pytest.mark.parametrize("kwargs", [
    dict(kl_coef=0.2, loss_aggregation="seq-mean-token-sum-norm"),
    dict(kl_coef=0.2, lora=dict(r=4, lora_alpha=8, target_modules="all-linear")),
    # SGD: Adam's first steps move every weight by ~lr whatever its gradient's size, so a
    # difference of 1e-7 in a near-zero gradient becomes 1e-3 in the weights and later steps part.
    dict(kl_coef=0.1, updates_per_rollout=2, minibatch_size=8, optimizer=functools.partial(torch.optim.SGD, lr=1e-2)),
], ids=["full-kl", "lora-kl", "reused-minibatches"])
def test_training_gradients_with_padding_free_equal_the_padded_one_pass(warm_start_dir, arithmetic_rows, kwargs):
    """Loss, reference and old log-prob forwards all packed, under a token budget of real tokens
    (4 × 14: one group per HF generate call, so both runs sample the same rollout)."""
    padded, _ = _grads(warm_start_dir, arithmetic_rows, **kwargs)
    packed, module = _grads(warm_start_dir, arithmetic_rows, padding_free=True, max_tokens_per_micro_batch=4 * 14,
                            **kwargs)
    assert module.micro_batching.padding_free
    _assert_same(padded, packed)


def test_attention_that_cannot_keep_packed_sequences_apart_is_refused(warm_start_dir):
    model = task.build_model()
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match="padding_free=True needs .*'flex_attention'.*attn_implementation='sdpa'"):
        RLModule(model, reward_funcs=[task.exact_answer], tokenizer=task.build_tokenizer(), padding_free=True)
