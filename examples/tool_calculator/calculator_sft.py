"""Build the warm start: supervised fine-tuning of a tiny Qwen2 on ``traces.jsonl``.

The loss covers the assistant turns only (the tool call and the final answer, each with its
``<|im_end|>``); the prompt, system turn and tool results are context. The traces mix tool calls
and direct answers (see make_traces.py), so the warm start calls the tool on part of the prompts
only and leaves RL room. The step count was chosen on the dev products, not the test ones. The
result is small and shipped in ``warm_start/``; this script rebuilds it bit for bit on CPU (fixed
seeds): ``python examples/tool_calculator/calculator_sft.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import random

import torch
from transformers.utils import get_json_schema

import greedy_eval as evaluate  # noqa: E402  (examples/tool_calculator/greedy_eval.py)
import calculator as task

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "warm_start")


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


def train(traces: list[dict], steps: int, batch_size: int = 16, lr: float = 2e-3, seed: int = 0,
          eval_every: int = 0):
    tokenizer = task.build_tokenizer()
    model = task.build_model(seed=seed)
    data = [encode(tokenizer, t["messages"]) for t in traces]
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / steps))
    model.train()
    for step in range(steps):
        batch = rng.sample(data, batch_size)
        width = max(len(x) for x, _ in batch)
        x = torch.tensor([r + [task.PAD_ID] * (width - len(r)) for r, _ in batch])
        y = torch.tensor([r + [-100] * (width - len(r)) for _, r in batch])
        loss = model(input_ids=x, attention_mask=(x != task.PAD_ID).long(), labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            print(f"sft step {step:4d}  loss {loss.item():.3f}", flush=True)
        if eval_every and (step + 1) % eval_every == 0:
            print(f"  dev after {step + 1} steps: {evaluate.evaluate(model, tokenizer, task.split_pairs()[1])}", flush=True)
            model.train()
    return model, tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", default=os.path.join(HERE, "traces.jsonl"))
    parser.add_argument("--out", default=DEFAULT_DIR)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-every", type=int, default=0, help="print dev accuracy every N steps (choosing --steps)")
    args = parser.parse_args()
    with open(args.traces) as f:
        traces = [json.loads(line) for line in f]
    model, tokenizer = train(traces, args.steps, lr=args.lr, eval_every=args.eval_every)
    _, dev, test = task.split_pairs()
    for name, pairs in (("dev", dev), ("held-out test", test)):
        r = evaluate.evaluate(model, tokenizer, pairs)
        print(f"greedy after SFT, {name} ({len(pairs)} products): accuracy {r['accuracy']:.1%}, "
              f"tool calls {r['tool_call_frequency']:.1%}")
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
