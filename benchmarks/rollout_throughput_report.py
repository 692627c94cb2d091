"""The table of benchmarks/rollout_throughput.py, from its JSON (printed by the script, rendered
into docs/results.md by benchmarks/headlines.py): one function, so the two cannot drift."""
from __future__ import annotations


def table(data: dict) -> str:
    """Per vocabulary: each engine's median seconds per rollout, mean completion length, generated
    tokens per second, and that rate over ``transformers.generate``'s."""
    n = data["prompts"] * data["group_size"]
    lines = [f"{n} completions × ≤ {data['new_tokens']} new tokens, Llama 4×256 (head_dim 64), fp32, "
             f"{data['threads']} torch threads, median of {data['reps']} ({data['date']}):", "",
             "| vocab | engine | s / rollout | mean length | generated tokens/s | vs generate |",
             "|---:|---|---:|---:|---:|---:|"]
    base: dict[int, float] = {}
    for row in data["rows"]:
        rate = row["tokens"] / row["seconds"]
        base.setdefault(row["vocab"], rate)
        lines.append(f"| {row['vocab']:,} | {row['engine']} | {row['seconds']:.2f} | {row['tokens'] / n:.1f} | "
                     f"{rate:,.0f} | {rate / base[row['vocab']]:.1f}× |")
    return "\n".join(lines) + "\n"
