"""Write ``traces.jsonl``: SFT traces of the tool-call format for the warm start.

Each trace is one conversation (``{"messages": [...]}``) rendered with ``tools=[multiply]``:
``TOOL_SHARE`` of them call the tool (user ``a*b=`` → assistant ``<tool_call>{"name": "multiply",
"arguments": {"a": a, "b": b}}</tool_call>`` → tool ``a*b`` → assistant ``a*b``), the others answer
directly (user → assistant ``a*b``), which a 2-layer model cannot learn to do right. So the warm
start knows the format but uses the tool only some of the time: RL has room to raise the
tool-call frequency and, with it, accuracy. The pairs are from ``task.split_pairs()``'s training
side. ``python examples/tool_calculator/make_traces.py`` rewrites the file bit for bit.

Args (command line): ``--n`` traces (400), ``--tool-share`` (0.5), ``--seed`` (0), ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import random

import calculator as task

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL_SHARE = 0.5


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


def make(n: int = 400, tool_share: float = TOOL_SHARE, seed: int = 0) -> list[dict]:
    train, _, _ = task.split_pairs()
    rng = random.Random(seed)
    return [trace(a, b, rng.random() < tool_share) for a, b in train[:n]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--tool-share", type=float, default=TOOL_SHARE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "traces.jsonl"))
    args = parser.parse_args()
    traces = make(args.n, args.tool_share, args.seed)
    with open(args.out, "w") as f:
        f.writelines(json.dumps(t) + "\n" for t in traces)
    used = sum(len(t["messages"]) > 2 for t in traces)
    print(f"{len(traces)} traces ({used} with a tool call) -> {args.out}")


if __name__ == "__main__":
    main()
