"""Tiny reward models built by the tests: a Llama sequence classifier with its own tokenizer
(the policy's symbols plus chat markers ``<u> <a> <e>`` and a chat template), either randomly
initialised or set by hand to prefer texts that end in ``"7"``."""
from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

VOCAB = ["<pad>", "<unk>", "<u>", "<a>", "<e>"] + list("0123456789+=")
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<u>' if m['role'] == 'user' else '<a>' }}{{ m['content'] }}<e>"
                 "{% endfor %}")
PREFERENCE = 1.5  # the hand-set model's score for a text that ends in "7" (0 otherwise)


def build_reward_tokenizer(pad: bool = True) -> PreTrainedTokenizerFast:
    """One token per character or ``<marker>``; no BOS; a chat template of its own."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("<[a-z]+>|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    kwargs = {"pad_token": "<pad>"} if pad else {}
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **kwargs)
    out.chat_template = CHAT_TEMPLATE
    return out


def build_reward_model(seed: int = 0, num_labels: int = 1) -> LlamaForSequenceClassification:
    """2 layers × 128, head_dim 64, randomly initialised (every token of the text moves its score).
    Its config has no ``pad_token_id``: `RewardModel` sets it from the tokenizer."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(VOCAB), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=64,
                         num_labels=num_labels)  # no pad_token_id, as many released reward models
    return LlamaForSequenceClassification(config)


def build_prefers_seven() -> LlamaForSequenceClassification:
    """Scores ``PREFERENCE`` when the last token is ``"7"``, else exactly 0.

    Every block's output projections are zero, so the residual stream carries the embedding
    through; only ``"7"`` has a non-zero embedding (unit vector e0), which the final RMSNorm
    scales by 1/sqrt(1/128 + eps); the score head reads e0 with the inverse of that factor."""
    model = build_reward_model()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[VOCAB.index("7"), 0] = 1.0
        model.score.weight.zero_()
        model.score.weight[0, 0] = PREFERENCE * (1 / 128 + model.config.rms_norm_eps) ** 0.5
    return model


def save(model, path, tokenizer=None) -> str:
    model.save_pretrained(str(path))
    (tokenizer or build_reward_tokenizer()).save_pretrained(str(path))
    return str(path)
