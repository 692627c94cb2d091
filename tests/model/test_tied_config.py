"""A checkpoint whose config ties the head to the embedding while its two tensors differ: the
model is trained, served and exported untied, as transformers computes it, with a warning. An
adapter on a tied head (which would untie it in the trainer only) is refused."""
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from lightning_rlpt.model.export import write_policy
from lightning_rlpt.model.loading import load_policy


def tiny_qwen2(tmp_path, tie_in_config: bool):
    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)  # untied: lm_head.weight differs from embed_tokens.weight
    model.save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**meta, "tie_word_embeddings": tie_in_config}))
    return model


def test_a_tied_config_over_differing_tensors_is_untied_with_a_warning(tmp_path):
    saved = tiny_qwen2(tmp_path / "ckpt", tie_in_config=True)
    with pytest.warns(UserWarning, match="ties its LM head .* two different tensors"):
        policy = load_policy(str(tmp_path / "ckpt"))
    assert torch.equal(policy.lm_head.weight, saved.lm_head.weight)  # the checkpoint's head, not the embedding
    assert policy.config.tie_word_embeddings is False  # what vLLM and an export are built from
    write_policy(policy, False, str(tmp_path / "ckpt"), {}, str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    assert torch.equal(load_file(str(tmp_path / "out" / "model.safetensors"))["lm_head.weight"], saved.lm_head.weight)


def test_a_truly_tied_model_stays_tied_without_a_word(tmp_path, recwarn):
    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    policy = load_policy(str(tmp_path))
    assert policy.lm_head.weight is policy.model.embed_tokens.weight and policy.config.tie_word_embeddings
    assert not [w for w in recwarn if "ties its LM head" in str(w.message)]


@pytest.mark.parametrize("lora", [dict(r=4, target_modules=["q_proj", "lm_head"]),
                                  dict(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"])],
                         ids=["lora-on-head", "head-saved"])
def test_an_adapter_on_a_tied_head_is_refused(tmp_path, lora):
    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="adapts the LM head .* tied to its input embedding.*Leave lm_head out"):
        load_policy(str(tmp_path), lora=lora)
    assert load_policy(str(tmp_path), lora=dict(r=4)).get_output_embeddings().weight is not None  # all-linear: fine
