"""The tests' own tiny task: 2-digit addition over a 15-symbol vocabulary (``0-9 + =`` and
``<pad> <s> </s>``), a tiny Llama builder and an exact-answer reward. The same vocabulary as
the demo's shipped warm start (``examples/arithmetic/warm_start``, used here as a checkpoint
that gets some sums right), but no code of the example: tests exercise the library, and the
example's own tests live in tests/examples/."""
from __future__ import annotations

import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>"]
SYMBOLS = list("0123456789+=")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; ``<s>`` prepended; left padding (prompts)."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + SYMBOLS)}, unk_token="<pad>"))
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


def split_pairs(held_out: int = 300, seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, held-out) 2-digit pairs, split by *unordered* pair so ``b+a`` never leaks across."""
    unordered = sorted({(min(a, b), max(a, b)) for a in range(10, 100) for b in range(10, 100)})
    random.Random(seed).shuffle(unordered)
    held, seen = [], set()
    for a, b in unordered:
        if len(held) >= held_out:
            break
        held.append((a, b))
        seen.add((a, b))
    train = [(a, b) for a in range(10, 100) for b in range(10, 100) if (min(a, b), max(a, b)) not in seen]
    random.Random(seed + 1).shuffle(train)
    return train, held


def rows(pairs: list[tuple[int, int]]) -> list[dict[str, str]]:
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]


def exact_answer(prompts, completions, answer, completion_ids, **_) -> list[float]:
    """1 for the exact sum followed by ``</s>``, else 0."""
    return [float(c == a and len(ids) > 0 and ids[-1] == EOS_ID)
            for c, a, ids in zip(completions, answer, completion_ids)]
