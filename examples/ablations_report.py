"""The ablations' table and summary, printed by ablations.py and rendered from its JSON into the
docs (benchmarks/headlines.py): one function each, so the page and the script cannot drift. Imports
nothing heavy."""
from __future__ import annotations


def settings_line(s: dict) -> str:
    return (f"{s['steps']} GRPO steps per arm and seed, {s['prompts']} prompts × {s['group_size']} completions, "
            f"β {s['kl_coef']}, seeds {s['seeds']}; validation (curve, selection): greedy on {s['dev_prompts']} dev "
            f"sums every {s['val_every']} steps; test: greedy on {s['held_out']} held-out sums, once, after training.")


def table(data: dict) -> str:
    """The settings line, then one row per arm (``data``: ablations.py's JSON)."""
    s, results = data["settings"], data["results"]
    lines = ["| arm | final test accuracy (± half the range over seeds) | Δ test vs grpo, per seed (points) | "
             f"final dev accuracy | median steps to {s['target']:.0%} dev | mean KL | mean entropy | "
             "wall s of fit (all seeds) |", "|---|---|---|---|---|---|---|---|"]
    base = results.get("grpo")
    for name, r in results.items():
        steps = f"{r['steps_to_target']:g}" if r["steps_to_target"] is not None else f"> {s['steps']} (some seed)"
        lines.append(f"| {name} | {r['test_accuracy']:.1%} ± {r['test_spread'] / 2:.1%} | {delta(r, base, name)} | "
                     f"{r['final_dev']:.1%} | {steps} | {r['mean_kl']:.4f} | {r['mean_entropy']:.3f} | "
                     f"{r['seconds']:.0f} |")
    return settings_line(s) + "\n\n" + "\n".join(lines) + "\n\n" + machine_line(data)


def delta(r: dict, base: dict | None, name: str) -> str:
    if base is None or name == "grpo":
        return "—"
    return " / ".join(f"{100 * (a - b):+.1f}" for a, b in zip(r["test_per_seed"], base["test_per_seed"]))


def signed(x: float) -> str:
    return f"{x:+.1f}".replace("-", "−")


def machine_line(data: dict) -> str:
    return (f"{len(data['results'])} arms in {data['seconds']:.0f} s on {data['cpus']} cores, {data['date']} "
            f"(1-minute load average {data['load_before']:.1f} before, {data['load_after']:.1f} after).")


def summary(data: dict) -> str:
    """The figures docs/results.md quotes: the arms' range against GRPO, the paired differences,
    and the KL of the arms that reset the reference against GRPO's."""
    results = data["results"]
    grpo = results["grpo"]
    others = {n: r for n, r in results.items() if n != "grpo"}
    low = min(others, key=lambda n: others[n]["test_accuracy"])
    high = max(others, key=lambda n: others[n]["test_accuracy"])
    paired = [100 * (a - b) for r in others.values() for a, b in zip(r["test_per_seed"], grpo["test_per_seed"])]
    text = (f"GRPO's final test accuracy is {grpo['test_accuracy']:.1%}; the other arms' means run from "
            f"{others[low]['test_accuracy']:.1%} (`{low}`) to {others[high]['test_accuracy']:.1%} (`{high}`), "
            f"per-seed paired differences from {signed(min(paired))} to {signed(max(paired))} points.")
    if "reference_reset" in results:
        ratio = grpo["mean_kl"] / results["reference_reset"]["mean_kl"]
        text += (f" Resetting the reference cuts the mean KL to it {ratio:.1f}× "
                 f"({results['reference_reset']['mean_kl']:.3f} vs {grpo['mean_kl']:.3f}).")
    return text.replace("%", " %")
