"""The calculator example's table, printed by run_calculator.py and rendered from its JSON into
docs/results.md (benchmarks/headlines.py): one function, so the two cannot drift."""

COLUMNS = {"accuracy": "accuracy, greedy", "sampled_accuracy": "accuracy, sampled (T=1)",
           "calls": "tool calls, greedy", "sampled_calls": "tool calls, sampled"}


def table(arms: dict[str, dict], steps: int, held_out: int) -> str:
    """Per arm: each measure before → after the GRPO steps, and the GRPO time."""
    lines = [f"held-out products: {held_out}; before -> after {steps} GRPO steps",
             "| arm | " + " | ".join(COLUMNS.values()) + " | GRPO time |", "|---|---|---|---|---|---|"]
    for arm, r in arms.items():
        cells = [f"{r[k + '_before']:.1%} → {r[k + '_after']:.1%}" for k in COLUMNS]
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {r['seconds']:.0f} s |")
    return "\n".join(lines)
