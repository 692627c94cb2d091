"""A hand-set model whose greedy decoding follows a script by *position*: a tiny GPT-2 whose
blocks add nothing (attention and MLP output projections zero), whose token embeddings are
zero and whose position embedding ``p`` points at one hidden unit per vocabulary entry, so the
logits at position ``p - 1`` pick ``script[p]``, the token that lands at position ``p``, whatever
the tokens before it are (EOS where the script says nothing).

Why this construction: it is exact and instant (no training), any engine that places tokens at
the right positions (left padding, prefix caching, a growing multi-turn context) reproduces it
token for token, and a test can make it spell a tool call and a final answer at known
positions of an episode: the call's tokens at the positions after the prompt, the answer's
after the tool result, whose length the test works out (``episode_script``). GPT-2's learned
absolute position embeddings make this possible; a RoPE model (Llama) has no such handle.
vLLM runs GPT-2 (head_dim 64 here, which its CPU attention supports).
"""
from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

MARGIN = 20.0  # logit gap between the scripted token and every other after the final LayerNorm


def scripted_gpt2(script: dict[int, int], vocab_size: int, eos_id: int, positions: int = 512) -> GPT2LMHeadModel:
    """A GPT-2 whose greedy choice for position ``p`` is ``script.get(p, eos_id)``.

    Args:
        script: position -> token id to place there (positions of the whole sequence from 0,
            prompt included).
        vocab_size: the tokenizer's size (at most the hidden width, 128).
        eos_id: the token at positions the script leaves out.
        positions: ``n_positions``.
    """
    width = 128
    if vocab_size > width:
        raise ValueError(f"vocab_size {vocab_size} > hidden width {width}")
    config = GPT2Config(vocab_size=vocab_size, n_positions=positions, n_embd=width, n_layer=1, n_head=2,
                        tie_word_embeddings=False, bos_token_id=eos_id, eos_token_id=eos_id,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for block in model.transformer.h:  # blocks add zero to the residual stream
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.zero_()
                proj.bias.zero_()
        model.transformer.wte.weight.zero_()
        wpe = torch.zeros(positions, width)
        wpe[:, eos_id] = 1.0
        for p, token in script.items():  # the logits at p - 1 choose the token at p
            wpe[p - 1] = 0.0
            wpe[p - 1, token] = 1.0
        model.transformer.wpe.weight.copy_(wpe)
        # After ln_f a one-hot becomes a peak of ~sqrt(width) over a flat floor: lm_head reads
        # unit v as token v's logit, scaled so the gap is MARGIN.
        gap = width ** 0.5
        model.lm_head.weight.copy_(torch.eye(vocab_size, width) * (MARGIN / gap))
    return model.eval()


def suffix_text(results: list[str]) -> str:
    """What `episodes_fixtures.TOOLS_TEMPLATE` puts after a model turn ended by EOS (``<|im_end|>``)
    and answered by ``results``: the rest of the end of turn, one user turn of
    ``<tool_response>`` blocks, the next generation prompt. Written out by hand, so a loop that
    appended anything else would move every later scripted token off its position."""
    blocks = "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in results)
    return f"\n<|im_start|>user{blocks}<|im_end|>\n<|im_start|>assistant\n"


def lay_out(tok, schemas: list[dict], rows: list[tuple[str, list[tuple[str, list[str]]]]], gap: int = 4):
    """Prompts and a script for ``rows``: ``(question, turns)``, each turn ``(model text, tool
    results that answer it)``. Each row's prompt is padded (dots after the question) so it starts
    past the previous row's episode, keeping the positions where rows generate apart.

    Returns ``(prompts, script, episodes)``: the conversational prompts, position -> token, and
    per row the expected ``(completion ids, model mask)``.
    """
    eos = tok.eos_token_id
    prompts, script, episodes, start = [], {}, [], 0
    for question, turns in rows:
        content = question
        while True:
            messages = [{"role": "user", "content": content}]
            pos = len(tok.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])
            if pos >= start:
                break
            content += "." * (start - pos)
        prompts.append(messages)
        ids, mask = [], []
        for text, results in turns:
            model = tok(text, add_special_tokens=False)["input_ids"] + [eos]
            for k, token in enumerate(model):
                assert script.get(pos + k, token) == token, "scripts of two rows overlap"
                script[pos + k] = token
            ids, mask, pos = ids + model, mask + [1] * len(model), pos + len(model)
            if results:
                given = tok(suffix_text(results), add_special_tokens=False)["input_ids"]
                ids, mask, pos = ids + given, mask + [0] * len(given), pos + len(given)
        episodes.append((ids, mask))
        start = pos + gap
    return prompts, script, episodes
