"""3-digit multiplication with a calculator tool: a character-level tokenizer with a Qwen/Hermes-style
chat template, a tiny Qwen2, the ``multiply`` tool, the data split and the reward.

The tokenizer spells every printable ASCII character (and newline) as one token, except digits,
which come in chunks of up to three from the left (``146970`` → ``146`` ``970``), as Llama 3's and
GPT-4's tokenizers split numbers: a factor is then one token, which a 2-layer model learns to copy
into the tool call (spelled digit by digit, four SFT attempts never copied them). Plus the chat
markers: ``<|im_start|>``, ``<|im_end|>`` (EOS) and ``<pad>`` are special (dropped when decoding
with ``skip_special_tokens``); ``<tool_call>``, ``</tool_call>``, ``<tool_response>`` and
``</tool_response>`` are added tokens that stay in decoded text, as in Qwen2.5's tokenizer, so a
parser sees them. The chat template follows Qwen2.5's layout, compacted so an episode stays
around 130 tokens: ``tools=`` adds a system turn listing the tools' names, an assistant's
``tool_calls`` are written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and a
``tool`` message becomes ``<|im_start|>tool\\n<tool_response>…</tool_response><|im_end|>``.
Turns are not followed by a newline, so the rendering of a conversation that ends with the
model's own turn is exactly the model's tokens: nothing is re-tokenized between turns.

The split is by unordered pair (``a*b`` and ``b*a`` on the same side), as in examples/arithmetic:
``HELD_OUT`` test products (reported), ``DEV`` dev products (for choices such as the warm start's
step count), and the rest for SFT traces and RL prompts.
"""
from __future__ import annotations

import json
import random
import string
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
TOOL_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]  # 94 visible characters, space and newline
PAD_ID, IM_START_ID, EOS_ID = 0, 1, 2
NUMBERS = [f"{n:0{w}d}" for w in (2, 3) for n in range(10 ** w)]  # every 2- and 3-digit chunk (1-digit: in CHARS)
HELD_OUT = 200  # test products (one order of each unordered pair)
DEV = 100       # dev products, disjoint from the test pairs

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>"
    "{%- for t in tools %}{{ (t.function.name if t.function is defined else t.name) }}"
    "{%- if not loop.last %} {% endif %}{%- endfor %}</tools><|im_end|>{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>tool\n<tool_response>{{ m.content }}</tool_response><|im_end|>"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content if m.content else '' }}"
    "{%- for c in (m.tool_calls or []) %}{%- set f = c.function if c.function is defined else c %}"
    "<tool_call>{\"name\": \"{{ f.name }}\", \"arguments\": {{ f.arguments | tojson }}}</tool_call>"
    "{%- endfor %}<|im_end|>"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer with the chat template (no BOS: the template starts every turn).

    Example:
        >>> tok = build_tokenizer()
        >>> tok.decode(tok("<tool_call>7</tool_call>", add_special_tokens=False)["input_ids"])
        '<tool_call>7</tool_call>'
    """
    vocab = {tok: i for i, tok in enumerate(SPECIALS + TOOL_MARKERS + CHARS + NUMBERS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    # Digits in chunks of up to three from the left ("146970" -> "146", "970"), as Llama 3's tokenizer does.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d{1,3}|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_MARKERS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                   unk_token="?", padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def vocab_size() -> int:
    return len(SPECIALS) + len(TOOL_MARKERS) + len(CHARS) + len(NUMBERS)


def build_model(seed: int = 0) -> Qwen2ForCausalLM:
    """2 layers × 128 wide, head_dim 64 (vLLM's CPU attention rejects smaller heads), 256 positions."""
    import torch

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size(), hidden_size=128, intermediate_size=384, num_hidden_layers=2, rope_theta=10000.0,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                         bos_token_id=IM_START_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


def split_pairs(seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, dev, test) pairs of 3-digit factors, split by unordered pair.

    ``HELD_OUT + DEV`` unordered pairs are drawn at random and asked in one random order each; the
    training side is a stream of other random pairs (there are ~405,000 unordered pairs, too many
    to list), none of whose unordered pair is held out.
    """
    rng = random.Random(seed)
    held: set[tuple[int, int]] = set()
    oriented = []
    while len(oriented) < HELD_OUT + DEV:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        if (min(a, b), max(a, b)) not in held:
            held.add((min(a, b), max(a, b)))
            oriented.append((a, b))
    test, dev = oriented[:HELD_OUT], oriented[HELD_OUT:]
    train = []
    while len(train) < 20_000:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        if (min(a, b), max(a, b)) not in held:
            train.append((a, b))
    return train, dev, test


def rows(pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Conversational prompts (one user turn ``a*b=``) with the product as the ``answer`` column."""
    return [{"prompt": [{"role": "user", "content": f"{a}*{b}="}], "answer": str(a * b)} for a, b in pairs]


def tool_call_text(a: int, b: int) -> str:
    """What the model writes to call the tool (Hermes format, ``json.dumps`` spacing)."""
    return "<tool_call>" + json.dumps({"name": "multiply", "arguments": {"a": a, "b": b}}) + "</tool_call>"


def final_answer(completion: Any) -> str:
    """The text of the episode's last assistant turn.

    ``completion`` is a list of chat messages (conversational prompts: the episode's messages) or
    the episode's decoded text, where the turns after a tool result start with ``assistant\\n``
    (``<|im_start|>`` is dropped when decoding).
    """
    if isinstance(completion, list):
        turns = [m for m in completion if m.get("role") == "assistant"]
        return str(turns[-1].get("content") or "").strip() if turns else ""
    text = str(completion)
    for marker in ("assistant\n", "</tool_response>"):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
    return text.replace("<|im_end|>", "").strip()


def exact_answer(prompts, completions, answer, **_) -> list[float]:
    """1 when the episode's last assistant turn is exactly the product, else 0 (TRL signature)."""
    return [float(final_answer(c) == a) for c, a in zip(completions, answer)]


def called_tool(completion: Any) -> bool:
    """Whether the episode contains a tool call."""
    if isinstance(completion, list):
        return any(m.get("tool_calls") or "<tool_call>" in str(m.get("content") or "") for m in completion)
    return "<tool_call>" in str(completion)
