"""2-digit addition as an RL task: a character-level tokenizer, a tiny Llama, data and a reward.

The vocabulary is the 12 symbols ``0-9 + =`` plus ``<pad> <s> </s>``; answers are written most
significant digit first and end with ``</s>``. ``python examples/arithmetic/task.py`` rewrites
``train.jsonl`` / ``val.jsonl`` / ``dev.jsonl`` beside it, the prompt files ``config.yaml`` uses.

The split is by **unordered** pair: ``a+b`` and ``b+a`` always fall on the same side, so no
held-out sum has its mirror in training. 300 unordered pairs are the held-out **test** set (one
order of each, chosen at random, is asked; ``val.jsonl``, what the demo reports), 200 more are the
**dev** set for model selection (``dev.jsonl``); the mirrors of test and dev sums are used nowhere.
Training (SFT warm start and RL) gets both orders of the remaining 3,595 unordered pairs (7,108 sums).
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
HELD_OUT = 300  # test sums (one per unordered pair)
DEV = 200       # dev sums for model selection (one per unordered pair, disjoint from the test pairs)


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


def unordered(pair: tuple[int, int]) -> tuple[int, int]:
    """The unordered pair of a sum: ``a+b`` and ``b+a`` map to the same key."""
    return (min(pair), max(pair))


def split_pairs_with_dev(seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, dev, test), split by unordered pair.

    The 4,095 unordered pairs ``{a, b}`` (10 ≤ a ≤ b ≤ 99) are shuffled with ``seed``: the first
    ``HELD_OUT`` are the test set, the next ``DEV`` the dev set, each asked in one order chosen at
    random (``a+a`` has only one); training gets both orders of every other unordered pair. No
    unordered pair appears on two sides, and the mirror of a test or dev sum is never trained on.
    """
    rng = random.Random(seed)
    keys = sorted({unordered(p) for p in all_pairs()})
    rng.shuffle(keys)
    oriented = [(a, b) if rng.random() < 0.5 else (b, a) for a, b in keys[:HELD_OUT + DEV]]
    test, dev = oriented[:HELD_OUT], oriented[HELD_OUT:]
    held = set(keys[:HELD_OUT + DEV])
    train = [p for p in all_pairs() if unordered(p) not in held]
    rng.shuffle(train)
    return train, dev, test


def split_pairs(seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, held-out test): 300 sums whose unordered pairs are never trained on, neither in SFT nor in RL.

    The dev set for model selection is `dev_pairs` (`split_pairs_with_dev` returns all three).
    """
    train, _, test = split_pairs_with_dev(seed)
    return train, test


def dev_pairs(seed: int = 0) -> list[tuple[int, int]]:
    """The 200 dev sums: for model selection (checkpoints, ``ReferenceReset(mode="best")``), not for reporting."""
    return split_pairs_with_dev(seed)[1]


def rows(pairs: list[tuple[int, int]]) -> list[dict[str, str]]:
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]


def write_jsonl(directory: str, seed: int = 0) -> tuple[str, str, str]:
    """Write ``train.jsonl``, ``val.jsonl`` (the held-out test sums) and ``dev.jsonl`` for configs and the CLI.

    Example:
        >>> write_jsonl("examples/arithmetic")  # doctest: +SKIP
        ('examples/arithmetic/train.jsonl', 'examples/arithmetic/val.jsonl', 'examples/arithmetic/dev.jsonl')
    """
    train, dev, test = split_pairs_with_dev(seed)
    paths = []
    for name, pairs in (("train", train), ("val", test), ("dev", dev)):
        path = os.path.join(directory, f"{name}.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in rows(pairs))
        paths.append(path)
    return paths[0], paths[1], paths[2]


def exact_answer(prompts, completions, answer, completion_ids, **_) -> list[float]:
    """1 for the exact sum followed by ``</s>``, else 0."""
    return [float(c == a and len(ids) > 0 and ids[-1] == EOS_ID)
            for c, a, ids in zip(completions, answer, completion_ids)]


if __name__ == "__main__":
    print(*write_jsonl(os.path.dirname(os.path.abspath(__file__))), sep="\n")
