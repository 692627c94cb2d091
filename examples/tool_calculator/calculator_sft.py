"""Build the warm start: supervised fine-tuning of a tiny Qwen2 in two phases.

1. **format** (``--format-steps``, 800): tool traces only (make_traces.FORMAT), lr 2e-3 with a
   20-step warm-up and a linear decay. The model learns the call format and to copy the factors
   into it, and to copy the tool's result into its answer.
2. **mix** (``--mix-steps``, 200): half tool traces, half direct answers (make_traces.MIX), lr 5e-4
   constant. The model now calls the tool on part of the prompts and answers the others directly
   (wrongly: a 2-layer model cannot multiply), which leaves RL room.

The loss covers the assistant turns only (the tool call and the final answer, each with its
``<|im_end|>``); the prompt, system turn and tool results are context. Both step counts were chosen
on the dev products (not the test ones): ``--eval-every N`` prints dev accuracy and tool-call
frequency after the format phase and every N mix steps. The result (~2.5 MB) ships in ``warm_start/``; this script rebuilds it on
CPU with fixed seeds: ``python examples/tool_calculator/calculator_sft.py``.
"""
from __future__ import annotations

import argparse
import os
import random

import torch
from transformers.utils import get_json_schema

import greedy_eval as evaluate  # noqa: E402  (examples/tool_calculator/greedy_eval.py)
import make_traces
import calculator as task

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "warm_start")
BATCH = 16


def encode(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of the conversation and labels scoring only the assistant turns (by string difference)."""
    tools = [get_json_schema(task.multiply)]
    ids, labels, done = [], [], ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = tokenizer.apply_chat_template(messages[:i], tools=tools, add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(messages[:i + 1], tools=tools, tokenize=False)
        context = tokenizer(head[len(done):], add_special_tokens=False)["input_ids"]
        turn = tokenizer(full[len(head):], add_special_tokens=False)["input_ids"]
        ids += context + turn
        labels += [-100] * len(context) + turn
        done = full
    return ids, labels


def run_phase(model, tokenizer, traces: list[dict], steps: int, lr: float, decay: bool, seed: int,
              eval_every: int = 0, name: str = "") -> None:
    """``steps`` AdamW steps on random batches of ``traces`` (warm-up + linear decay when ``decay``)."""
    data = [encode(tokenizer, t["messages"]) for t in traces]
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    shape = (lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / steps)) if decay else (lambda s: 1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, shape)
    for step in range(steps):
        model.train()
        batch = rng.sample(data, BATCH)
        width = max(len(x) for x, _ in batch)
        x = torch.tensor([r + [task.PAD_ID] * (width - len(r)) for r, _ in batch])
        y = torch.tensor([r + [-100] * (width - len(r)) for _, r in batch])
        loss = model(input_ids=x, attention_mask=(x != task.PAD_ID).long(), labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            print(f"{name} step {step:4d}  loss {loss.item():.3f}", flush=True)
        if eval_every and (step + 1) % eval_every == 0:
            print(f"  dev after {step + 1} {name} steps: {evaluate.evaluate(model, tokenizer, task.split_pairs()[1])}",
                  flush=True)


def train(format_steps: int = 800, mix_steps: int = 200, seed: int = 0, eval_every: int = 0):
    """The two phases from a freshly built model; returns ``(model, tokenizer)``."""
    tokenizer = task.build_tokenizer()
    model = task.build_model(seed=seed)
    run_phase(model, tokenizer, make_traces.make(**make_traces.FORMAT), format_steps, lr=2e-3, decay=True,
              seed=seed, eval_every=format_steps if eval_every else 0, name="format")
    run_phase(model, tokenizer, make_traces.make(**make_traces.MIX), mix_steps, lr=5e-4, decay=False,
              seed=seed + 1, eval_every=eval_every, name="mix")
    return model, tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=DEFAULT_DIR)
    parser.add_argument("--format-steps", type=int, default=800)
    parser.add_argument("--mix-steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=0, help="print dev accuracy every N mix steps and after the format phase (choosing steps)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = train(args.format_steps, args.mix_steps, eval_every=args.eval_every)
    _, dev, test = task.split_pairs()
    for name, pairs in (("dev", dev), ("held-out test", test)):
        for tools in (True, False):
            r = evaluate.evaluate(model, tokenizer, pairs, tools=tools)
            print(f"greedy after SFT, {name} ({len(pairs)} products), tools {'on ' if tools else 'off'}: "
                  f"accuracy {r['accuracy']:.1%}, tool calls {r['tool_call_frequency']:.1%}")
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
