"""The report of benchmarks/memory_scaling.py: its tables (runs, growth, every run) and the text
that says how to read them, rendered from the results JSON (``memory_scaling.py --render``)."""
from __future__ import annotations

import statistics

from quiet import contention_note

PATHS = ("one-pass", "micro", "trl")
NAMES = {"one-pass": "lightning-rlpt, one pass", "micro": "lightning-rlpt, `max_tokens_per_micro_batch`",
         "trl": "TRL `GRPOTrainer`, same micro-batch"}


def _med(runs: list[dict], key) -> float:
    return statistics.median(key(r) if callable(key) else r[key] for r in runs)


def step_mb(r: dict) -> float:
    return r["peak_mb"] - r["rss_before_mb"]


def table(data: dict) -> str:
    """Medians per configuration, and × (largest / smallest size) per path."""
    sizes = data["sizes"].split(",")
    lines = ["| gradient checkpointing | path | rollout (prompts × G × completion) | tokens | micro-batch | "
             "peak RSS (MB) | step's own memory (MB) | RSS before the step (MB) | step time (s) | runs |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    groups = {}
    for r in data["runs"]:
        groups.setdefault((r["ckpt"], r["path"], r["size"]), []).append(r)
    for (ckpt, path, size), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], PATHS.index(kv[0][1]), sizes.index(kv[0][2]))):
        r0 = rs[0]
        tokens = r0["prompts"] * r0["group"] * (r0["prompt_len"] + r0["completion"])
        micro = "—" if path == "one-pass" else (f"≤ {r0['cap']:,} tokens" if path == "micro"
                                                else f"{r0['trl_rows']} rows × {r0['trl_accumulation']} accumulation steps")
        lines.append(f"| {'on' if ckpt else 'off'} | {NAMES[path]} | {size.replace('x', ' × ')} | {tokens:,} | {micro} | "
                     f"{_med(rs, 'peak_mb'):,.0f} | {_med(rs, step_mb):,.0f} | {_med(rs, 'rss_before_mb'):,.0f} | "
                     f"{_med(rs, 'step_s'):.1f} | {len(rs)} |")
    return "\n".join(lines)


def growth(data: dict) -> list[dict]:
    """Per path and checkpointing: the largest size's medians over the smallest's."""
    sizes = data["sizes"].split(",")
    out = []
    for ckpt in (False, True):
        for path in PATHS:
            ends = [[r for r in data["runs"] if r["ckpt"] == ckpt and r["path"] == path and r["size"] == s]
                    for s in (sizes[0], sizes[-1])]
            if not all(ends):
                continue
            small, large = ends
            out.append(dict(ckpt=ckpt, path=path, peak=_med(large, "peak_mb") / _med(small, "peak_mb"),
                            step=_med(large, step_mb) / _med(small, step_mb),
                            time=_med(large, "step_s") / _med(small, "step_s")))
    return out


def growth_table(data: dict) -> str:
    sizes = data["sizes"].split(",")
    lines = [f"| gradient checkpointing | path | × peak RSS | × step's own memory | × step time |",
             "|---|---|---:|---:|---:|"]
    for g in growth(data):
        lines.append(f"| {'on' if g['ckpt'] else 'off'} | {NAMES[g['path']]} | **{g['peak']:.2f}** | "
                     f"**{g['step']:.2f}** | {g['time']:.2f} |")
    return (f"Growth from rollout {sizes[0].replace('x', ' × ')} to {sizes[-1].replace('x', ' × ')} "
            f"(medians, larger over smaller):\n\n" + "\n".join(lines))


def per_run(data: dict) -> str:
    lines = ["| # | path | rollout | ckpt | peak RSS (MB) | step's own (MB) | RSS after model + optimizer (MB) | "
             "warm-up step (s) | step (s) | other processes (cores) |", "|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(data["runs"], 1):
        lines.append(f"| {i} | {r['path']} | {r['size']} | {'on' if r['ckpt'] else 'off'} | {r['peak_mb']:,.0f} | "
                     f"{step_mb(r):,.0f} | {r['rss_created_mb']:,.0f} | {r['warmup_s']:.1f} | {r['step_s']:.1f} | "
                     f"{r['others_cores']:.2f} |")
    return "\n".join(lines)


READING = (
    "Peak RSS is the whole process at the measured step's peak: weights, AdamW state and the runtime (the RSS "
    "before the step) plus the step's own memory. The step's own memory compares the two lightning-rlpt paths; "
    "across frameworks compare peak RSS. With one decoder layer, gradient checkpointing recomputes that whole "
    "layer in the backward, so the checkpointing rows cannot show what checkpointing saves in a deep model; they "
    "show that the caps hold with it on.")
READING_TRL = (
    "TRL 1.16's fused LM head scores only completion positions where Triton runs (CUDA, "
    "XPU); on CPU it scores every position, prompts included, in [≤ 4,096 tokens × 32,768 vocabulary] fp32 tiles "
    "(`trl/trainer/utils.py`, `add_fused_lm_head`; `trl/kernels/chunked_logprob.py`). By that code and its "
    "arithmetic (not profiled here), this CPU fallback is where TRL's extra memory and most of its extra time go: "
    "a micro-batch's head works on every prompt and completion position instead of its completion positions "
    "only; a GPU run would not show this gap.")


def report(data: dict) -> str:
    counts = {}
    for r in data["runs"]:
        key = (r["path"], r["size"], r["ckpt"])
        counts[key] = counts.get(key, 0) + 1
    low, high = min(counts.values()), max(counts.values())
    runs = f"{low}" if low == high else f"{low}–{high}"
    contention = contention_note(data["runs"], data["idle"], data["cpus"])
    note = (f"Measured {data['date']}, {data['cpus']} CPU cores ({data['cpu']}), {data['layers']} layer(s) × 896 wide, "
            f"vocabulary 151,936 (tied), fp32, prompts of {data['prompt_len']} tokens, completions forced to full "
            f"length; `max_tokens_per_micro_batch={data['cap']:,}`; {runs} run(s) per configuration in alternating "
            f"order, one process each, medians shown; {data['seconds'] / 60:.0f} min in all. " + contention[:1].upper()
            + contention[1:]
            + " Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()) + ".")
    return "\n".join(["# Memory as the rollout grows (benchmarks/memory_scaling.py)", "", table(data), "",
                      growth_table(data), "", READING + (" " + READING_TRL if any(r["path"] == "trl" for r in data["runs"]) else ""), "", note, "", "<details><summary>every run</summary>", "",
                      per_run(data), "", "</details>", ""])
