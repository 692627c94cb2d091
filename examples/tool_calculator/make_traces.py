"""The warm start's SFT traces of the tool-call format, in two sets.

Each trace is one conversation (``{"messages": [...]}``) rendered with ``tools=[multiply]``: a tool
trace calls the tool (user ``a*b=`` → assistant ``<tool_call>{"name": "multiply", "arguments":
{"a": a, "b": b}}</tool_call>`` → tool ``a*b`` → assistant ``a*b``); a direct trace answers at once
(user → assistant ``a*b``), which a 2-layer model cannot learn to do right.

- ``FORMAT``: 4,000 tool traces. Copying the factors into the call is what a tiny model learns
  slowly; with a few hundred mixed traces it never did (docs/agents_example.md).
- ``MIX``: 400 traces, half of them direct, on other products. A short second phase on them makes
  the warm start call the tool on part of the prompts only, which leaves RL room to raise the
  tool-call frequency and, with it, accuracy.

The pairs come from ``task.split_pairs()``'s training side (never a dev or test product), and the
sets are fixed by their seeds. ``python examples/tool_calculator/make_traces.py --out traces.jsonl``
writes one set to look at (``--set format|mix``); the SFT script builds them in memory.
"""
from __future__ import annotations

import argparse
import json
import random

import calculator as task

FORMAT = dict(n=4000, tool_share=1.0, offset=0, seed=0)
MIX = dict(n=400, tool_share=0.5, offset=4000, seed=1)
SETS = {"format": FORMAT, "mix": MIX}
RL_OFFSET = 5000  # RL prompts start after the traces' products


def trace(a: int, b: int, use_tool: bool) -> dict:
    """One conversation: with the tool call and its result, or a direct answer.

    Example:
        >>> trace(2, 3, True)["messages"][1]["content"]
        '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'
    """
    user = {"role": "user", "content": f"{a}*{b}="}
    answer = {"role": "assistant", "content": str(task.multiply(a, b))}
    if not use_tool:
        return {"messages": [user, answer]}
    call = {"role": "assistant", "content": task.tool_call_text(a, b)}
    return {"messages": [user, call, {"role": "tool", "content": str(task.multiply(a, b))}, answer]}


def make(n: int, tool_share: float, offset: int, seed: int) -> list[dict]:
    """``n`` traces on training pairs ``offset:offset+n``, each a tool trace with probability ``tool_share``."""
    train, _, _ = task.split_pairs()
    rng = random.Random(seed)
    return [trace(a, b, rng.random() < tool_share) for a, b in train[offset:offset + n]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), default="mix")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    traces = make(**SETS[args.set])
    with open(args.out, "w") as f:
        f.writelines(json.dumps(t) + "\n" for t in traces)
    used = sum(len(t["messages"]) > 2 for t in traces)
    print(f"{len(traces)} traces ({used} with a tool call) -> {args.out}")


if __name__ == "__main__":
    main()
