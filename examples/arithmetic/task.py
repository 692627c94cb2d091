"""2-digit addition as an RL task: a character-level tokenizer, a tiny Llama, data and a reward.

The vocabulary is the 12 symbols ``0-9 + =`` plus ``<pad> <s> </s>``; answers are written most
significant digit first and end with ``</s>``. ``python examples/arithmetic/task.py`` rewrites
``train.jsonl`` / ``val.jsonl`` beside it, the prompt files ``config.yaml`` trains on.
"""
from __future__ import annotations

import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>"]
SYMBOLS = list("0123456789+=")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
HELD_OUT = 300


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + SYMBOLS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<pad>", padding_side="left")


def build_model(vocab_size: int = len(SPECIALS) + len(SYMBOLS), seed: int = 0) -> LlamaForCausalLM:
    """2 layers × 128 wide, head_dim 64 (vLLM's CPU attention rejects smaller heads)."""
    import torch

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=64,
                         bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def all_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in range(10, 100) for b in range(10, 100)]


def split_pairs(seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, held-out): a fixed 300 pairs are never trained on, neither in SFT nor in RL."""
    pairs = all_pairs()
    random.Random(seed).shuffle(pairs)
    return pairs[HELD_OUT:], pairs[:HELD_OUT]


def rows(pairs: list[tuple[int, int]]) -> list[dict[str, str]]:
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]


def write_jsonl(directory: str, seed: int = 0) -> tuple[str, str]:
    """Write ``train.jsonl`` and ``val.jsonl`` (the `split_pairs` split) for configs and the CLI.

    Example:
        >>> write_jsonl("examples/arithmetic")  # doctest: +SKIP
        ('examples/arithmetic/train.jsonl', 'examples/arithmetic/val.jsonl')
    """
    paths = []
    for name, pairs in zip(("train", "val"), split_pairs(seed)):
        path = os.path.join(directory, f"{name}.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in rows(pairs))
        paths.append(path)
    return paths[0], paths[1]


def exact_answer(prompts, completions, answer, completion_ids, **_) -> list[float]:
    """1 for the exact sum followed by ``</s>``, else 0."""
    return [float(c == a and len(ids) > 0 and ids[-1] == EOS_ID)
            for c, a, ids in zip(completions, answer, completion_ids)]


if __name__ == "__main__":
    print(*write_jsonl(os.path.dirname(os.path.abspath(__file__))), sep="\n")
