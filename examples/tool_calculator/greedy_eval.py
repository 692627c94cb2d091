"""Held-out evaluation of the calculator task: accuracy and tool-call frequency, greedy or sampled.

A plain greedy episode loop on ``model.generate`` (batched, left-padded): the model's turn ends at
``<|im_end|>``; a ``<tool_call>{json}</tool_call>`` in it is run (when ``tools`` is on) and the
template's rendering of the ``tool`` message plus the next assistant header is appended, up to
``max_turns`` model turns. It is the example's own yardstick, independent of the trainer, so both
arms and the warm start are measured the same way. Greedy decoding hides a policy that calls the
tool on half its samples (the call is still the single likeliest first token), so
``temperature=1.0`` also measures what the policy samples (one episode per product, fixed seed).
"""
from __future__ import annotations

import json
import re

import torch
from transformers.utils import get_json_schema

import calculator as task

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def run_tool(text: str) -> str:
    """The tool message for the first call in ``text`` ("error: ..." for a malformed one)."""
    try:
        call = json.loads(CALL.search(text).group(1))
        args = call["arguments"]
        if call["name"] != "multiply" or not all(isinstance(args.get(k), int) for k in "ab"):
            return "error: call multiply with integer arguments a and b"
        return str(task.multiply(args["a"], args["b"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "error: malformed tool call"


def prompt_text(tokenizer, prompt: list[dict], tools: bool) -> str:
    kwargs = {"tools": [get_json_schema(task.multiply)]} if tools else {}
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False, **kwargs)


@torch.no_grad()
def greedy_episodes(model, tokenizer, rows: list[dict], tools: bool = True, max_turns: int = 3,
                    max_new_tokens: int = 64, temperature: float = 0.0) -> list[str]:
    """Each row's whole episode as text (prompt excluded), decoded without special tokens
    (greedy, or sampled at ``temperature`` > 0). The model is left in the mode it came in: a policy
    left in eval mode would train in it (Lightning warns of it at the fit's start)."""
    training = model.training
    model.eval()
    try:
        return _episodes(model, tokenizer, rows, tools, max_turns, max_new_tokens, temperature)
    finally:
        model.train(training)


def _episodes(model, tokenizer, rows, tools, max_turns, max_new_tokens, temperature) -> list[str]:
    contexts = [tokenizer(prompt_text(tokenizer, r["prompt"], tools), add_special_tokens=False)["input_ids"]
                for r in rows]
    start = [len(c) for c in contexts]
    active = list(range(len(rows)))
    for _ in range(max_turns):
        if not active:
            break
        enc = tokenizer.pad({"input_ids": [contexts[i] for i in active]}, return_tensors="pt")
        sample = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
        out = model.generate(**enc, max_new_tokens=max_new_tokens, **sample,
                             pad_token_id=task.PAD_ID, eos_token_id=task.EOS_ID)
        still = []
        for i, row in zip(active, out[:, enc["input_ids"].shape[1]:].tolist()):
            turn = row[: row.index(task.EOS_ID) + 1] if task.EOS_ID in row else [t for t in row if t != task.PAD_ID]
            contexts[i] = contexts[i] + turn
            text = tokenizer.decode(turn)
            if tools and "<tool_call>" in text and turn[-1] == task.EOS_ID:
                suffix = (f"<|im_start|>tool\n<tool_response>{run_tool(text)}</tool_response><|im_end|>"
                          "<|im_start|>assistant\n")
                contexts[i] += tokenizer(suffix, add_special_tokens=False)["input_ids"]
                still.append(i)
        active = still
    return [tokenizer.decode(c[s:], skip_special_tokens=True) for c, s in zip(contexts, start)]


def evaluate(model, tokenizer, pairs, tools: bool = True, temperature: float = 0.0, seed: int = 0) -> dict[str, float]:
    """``accuracy`` (exact product as the last turn) and ``tool_call_frequency`` on ``pairs``: greedy,
    or one episode per pair sampled at ``temperature`` (torch seeded with ``seed``).

    Example:
        >>> evaluate(model, tokenizer, task.split_pairs()[2])  # doctest: +SKIP
        {'accuracy': 0.41, 'tool_call_frequency': 0.47}
    """
    data = task.rows(pairs)
    if temperature:
        torch.manual_seed(seed)
    episodes = []
    for i in range(0, len(data), 100):
        episodes += greedy_episodes(model, tokenizer, data[i:i + 100], tools, temperature=temperature)
    scores = task.exact_answer(None, episodes, [r["answer"] for r in data])
    calls = [task.called_tool(e) for e in episodes]
    return {"accuracy": sum(scores) / len(data), "tool_call_frequency": sum(calls) / len(data)}
