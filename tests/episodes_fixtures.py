"""Tiny real tokenizers with chat templates for the episode tests (agents: tools, environments).

`build_chat_tokenizer(tools=True)`: one token per printable ASCII character (plus newline and
tab), Qwen/Hermes-style chat markers as single tokens: ``<|im_start|>``, ``<|im_end|>`` (EOS),
``<|endoftext|>`` (pad), and ``<tool_call>``, ``</tool_call>``, ``<tool_response>``,
``</tool_response>`` as plain (non-special) added tokens, as in Qwen2.5 — so decoding with
``skip_special_tokens=True`` keeps the tool-call tags the parser reads. Its chat template is a
trimmed Qwen2.5 template: a system block listing the ``tools=`` schemas, ``tool`` messages
grouped into one user turn of ``<tool_response>`` blocks, ``add_generation_prompt``.
Assistant contents are rendered verbatim (the model's raw text, tool-call tags included).

`build_chat_tokenizer(tools=False)`: the same vocabulary with a plain ChatML template that
ignores ``tools=`` (so `check_tools_template` must refuse it).

A model for these tokenizers: ``vocab_size=len(tokenizer)``, e.g. the tiny Qwen2 of conftest.
"""
from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AddedToken, PreTrainedTokenizerFast

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHARS = sorted(set(string.printable) - set("\x0b\x0c\r"))

TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nCall a tool as <tool_call>{\"name\": <name>, \"arguments\": <args>}</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif not (m.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

PLAIN_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

def build_chat_tokenizer(tools: bool = True) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with a Qwen/Hermes-style chat template (see the module docstring).

    Args:
        tools: True for the template that supports ``tools=`` and ``tool`` messages; False for a
            plain ChatML template that ignores them.

    Example:
        >>> tok = build_chat_tokenizer()
        >>> tok.convert_ids_to_tokens(tok.encode("<|im_start|>hi<tool_call>"))
        ['<|im_start|>', 'h', 'i', '<tool_call>']
    """
    vocab = {t: i for i, t in enumerate(SPECIAL + TOOL_TAGS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                        unk_token="<|endoftext|>", padding_side="left")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    tokenizer.chat_template = TOOLS_TEMPLATE if tools else PLAIN_TEMPLATE
    return tokenizer
