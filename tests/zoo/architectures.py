"""The model layouts people post-train, as tiny random models (head_dim 64, 2 layers, the tests'
15-symbol vocabulary), each keeping the structural features that matter to weight loading and
log-probs. One entry per architecture: what it is, which features it carries, how to build it."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import tiny_task as task

SIZE = dict(vocab_size=15, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            head_dim=64, max_position_embeddings=64, bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID,
            pad_token_id=task.PAD_ID)


@dataclass(frozen=True)
class Architecture:
    """``name``: the matrix's row; ``like``: the released models with this layout; ``features``:
    what the tiny model keeps of it; ``config``: (transformers config class name, its kwargs)."""

    name: str
    like: str
    features: tuple[str, ...]
    config: tuple[str, dict[str, Any]]
    refused: dict[str, str] = field(default_factory=dict)  # engine -> what its refusal must say

    def build(self, seed: int = 0) -> torch.nn.Module:
        import transformers

        config_class, kwargs = self.config
        config = getattr(transformers, config_class)(**{**SIZE, **kwargs})
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():  # random init at the configs' std (0.02) gives near-uniform logits: widen them
            for name, param in model.named_parameters():
                if param.dim() >= 2:
                    param.normal_(0.0, 0.08)
                elif name.endswith("bias"):
                    param.normal_(0.0, 0.1)
        return model

    def save(self, directory: str, seed: int = 0) -> str:
        os.makedirs(directory, exist_ok=True)
        self.build(seed).save_pretrained(directory)
        task.build_tokenizer().save_pretrained(directory)
        return directory


ARCHITECTURES = [
    Architecture("llama", "Llama-2/3 8B, TinyLlama (untied head)", ("untied head",),
                 ("LlamaConfig", dict(num_key_value_heads=2, tie_word_embeddings=False))),
    Architecture("llama3.2", "Llama-3.2 1B/3B", ("tied head", "rope_scaling llama3", "GQA"),
                 ("LlamaConfig", dict(num_key_value_heads=1, tie_word_embeddings=True,
                                      rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                                                           low_freq_factor=1.0, high_freq_factor=4.0,
                                                           original_max_position_embeddings=16)))),
    Architecture("qwen2.5", "Qwen2.5 0.5B-3B", ("tied head", "qkv bias", "GQA"),
                 ("Qwen2Config", dict(num_key_value_heads=1, tie_word_embeddings=True))),
    Architecture("qwen3", "Qwen3 0.6B-4B", ("tied head", "q/k RMSNorm"),
                 ("Qwen3Config", dict(num_key_value_heads=1, tie_word_embeddings=True))),
    Architecture("mistral", "Mistral 7B v0.1", ("sliding window 4 (shorter than a sequence)",),
                 ("MistralConfig", dict(num_key_value_heads=1, sliding_window=4, tie_word_embeddings=False))),
    Architecture("gemma2", "Gemma-2 2B/9B", ("tied head", "final logit soft-cap", "attention soft-cap",
                                               "scaled embeddings", "alternating sliding window 4"),
                 ("Gemma2Config", dict(num_key_value_heads=1, sliding_window=4, final_logit_softcapping=30.0,
                                       attn_logit_softcapping=50.0, query_pre_attn_scalar=64,
                                       hidden_activation="gelu_pytorch_tanh"))),
    Architecture("phi3", "Phi-3/3.5 mini", ("fused qkv_proj", "fused gate_up_proj", "untied head"),
                 ("Phi3Config", dict(num_key_value_heads=2, tie_word_embeddings=False, original_max_position_embeddings=64))),
    Architecture("olmo2", "OLMo-2 1B/7B (vLLM's Transformers backend)", ("post-norms", "q/k RMSNorm over all heads"),
                 ("Olmo2Config", dict(num_key_value_heads=2, tie_word_embeddings=False)),
                 refused={"vllm": "VLLMRollout cannot serve Olmo2ForCausalLM: this vLLM has no native implementation",
                          "vllm-server": "VLLMServerRollout cannot serve Olmo2ForCausalLM: this vLLM has no native"}),
]
BY_NAME = {arch.name: arch for arch in ARCHITECTURES}
