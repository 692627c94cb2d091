"""Logits the model's forward transforms after its LM head: Gemma 2's final soft-cap is applied
as the forward applies it (log-probs equal the forward's, fused kernel allowed or not), and any
other transform (Granite's ``logits_scaling``) is refused at construction instead of training on
another distribution than the one sampled."""
import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, GraniteConfig, GraniteForCausalLM

import tiny_task as task
from lightning_rlpt import RLModule
from lightning_rlpt.model.logprobs import check_head, completion_logprobs

SMALL = dict(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
             num_key_value_heads=1, head_dim=64, max_position_embeddings=64)


def _gemma(cap: float) -> Gemma2ForCausalLM:
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(Gemma2Config(**SMALL, final_logit_softcapping=cap, attn_logit_softcapping=None,
                                           sliding_window=64, query_pre_attn_scalar=64))
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # logits of a few units, so a cap of 2 really bends them
    return model.eval()


@pytest.mark.parametrize("fused", [True, False])
def test_soft_capped_logits_give_the_forwards_log_probs(fused):
    model = _gemma(cap=2.0)
    check_head(model)
    ids = torch.tensor([[3, 5, 7, 9, 11, 13]])
    mask = torch.ones_like(ids)
    expected = (model(input_ids=ids).logits[:, 2:-1].float() / 0.7).log_softmax(-1)
    expected = expected.gather(-1, ids[:, 3:, None]).squeeze(-1)
    uncapped = (model.lm_head(model.get_decoder()(input_ids=ids).last_hidden_state)[:, 2:-1] / 0.7).log_softmax(-1)
    assert (uncapped.gather(-1, ids[:, 3:, None]).squeeze(-1) - expected).abs().max() > 0.05  # the cap matters here
    ours, _ = completion_logprobs(model, ids, mask, 3, temperature=0.7, use_fused_kernel=fused)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_an_unknown_logit_transform_is_refused_at_construction():
    torch.manual_seed(0)
    config = GraniteConfig(**{k: v for k, v in SMALL.items() if k != "head_dim"}, logits_scaling=4.0)
    model = GraniteForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    with pytest.raises(ValueError, match="transforms its logits after the LM head"):
        check_head(model)
    with pytest.raises(ValueError, match="GraniteForCausalLM's forward transforms its logits"):
        RLModule(model, reward_funcs=[task.exact_answer], tokenizer=task.build_tokenizer())
