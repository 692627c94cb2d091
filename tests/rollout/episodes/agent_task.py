"""Shared pieces of the episode tests: a character-level tokenizer with a tool-aware chat
template (``</s>`` ends every turn, as ``<|im_end|>`` does for Qwen), tiny Llama models over it,
a warm start that has memorised scripted tool-calling conversations, and small environments."""
from __future__ import annotations

import json

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>"]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
TEMPLATE = (  # no whitespace outside the tags: a turn's rendering is a prefix of every longer one
    "{% if tools %}<s>system\ntools:{% for t in tools %} {{ t.function.name }}{% endfor %}</s>{% endif %}"
    "{% for m in messages %}<s>{{ m.role }}\n{{ m.content }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, ``<s>``/``</s>`` as special tokens, the template above."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + CHARS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<pad>", padding_side="left")
    out.chat_template = TEMPLATE
    return out


def build_model(seed: int = 0, positions: int = 512) -> LlamaForCausalLM:
    """2 layers × 128 wide, head_dim 64 (vLLM's CPU attention needs it)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(SPECIALS) + len(CHARS), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                         max_position_embeddings=positions, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class CountdownEnv:
    """Answers every model turn with ``"left: k"`` and finishes after ``turns`` steps; rewards
    1.0 per step whose text contains ``"7"``."""

    turns = 3

    def reset(self, row: dict) -> str:
        self.left = self.turns
        return "start env"

    def step(self, text: str):
        self.left -= 1
        return (f"left: {self.left}" if self.left else None), float("7" in text), self.left == 0


ENV_SCRIPT = [{"role": "user", "content": "env"}, {"role": "user", "content": "start env"},
              {"role": "assistant", "content": "a7"}, {"role": "user", "content": "left: 2"},
              {"role": "assistant", "content": "b"}, {"role": "user", "content": "left: 1"},
              {"role": "assistant", "content": "c7"}]


def memorise(conversations: list[tuple[list[dict], list[dict] | None]], steps: int = 400, seed: int = 0,
             positions: int = 512) -> LlamaForCausalLM:
    """A tiny Llama trained (all tokens, full batch, Adam) until greedy decoding replays each
    rendered conversation: ``(messages, tool schemas or None)``. The loop's tests then know what
    the model will say, so their counts can be worked out by hand."""
    tok = build_tokenizer()
    texts = [tok.apply_chat_template(m, tools=t, tokenize=False) for m, t in conversations]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in rows])
    model = build_model(seed, positions)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 3e-3:
            break
    return model.eval()
