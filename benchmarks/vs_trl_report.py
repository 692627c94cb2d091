"""The report of benchmarks/vs_trl.py: its tables (throughput, every run, learning curves), the
plot and the Markdown, rebuilt from the results JSON; and the settings both sides share."""
from __future__ import annotations

import statistics

from quiet import IDLE, contention_note

PROMPTS, GROUP, LR, MAX_NEW = 16, 8, 3e-5, 32
SIZES = {"small": dict(vocab=15, hidden=128, layers=2), "vocab32k": dict(vocab=32000, hidden=256, layers=4)}


NAMES = {"trl": "TRL `GRPOTrainer` (generate)", "hf": "lightning-rlpt, HF engine (generate)",
         "vllm": "lightning-rlpt, `VLLMRollout`"}
COMPARED = {"trl": "baseline", "hf": "like for like (both on generate)", "vllm": "vs TRL with generate"}
ORDER = ["trl", "hf", "vllm"]
# Each precision as TRL's GRPOConfig fields, lightning-rlpt's Trainer and vLLM settings, and its
# report title. Throughput keys without a precision (every run before the bf16 pair) are fp32.
PRECISIONS = {"fp32": dict(trl={}, ours={}, vllm_dtype="float32", title="fp32"),
              "bf16": dict(trl=dict(bf16=True), ours=dict(precision="bf16-mixed"), vllm_dtype="bfloat16",
                           title="bf16 autocast (TRL `bf16=True`, ours `precision=\"bf16-mixed\"`, vLLM bfloat16)")}


def _median(rs, key):
    return statistics.median(r[key] for r in rs)


def table(runs: list[dict]) -> str:
    by = {e: [r for r in runs if r["engine"] == e] for e in ORDER if any(r["engine"] == e for r in runs)}
    trl = _median(by["trl"], "median_step_s") if "trl" in by else float("nan")
    hf = _median(by["hf"], "median_step_s") if "hf" in by else float("nan")
    lines = ["| engine | compared | runs | median step (s) | × TRL (median step) | × our HF engine | "
             "start-up (s) | wall incl. start-up (s) | rollout / sync / rest (s) | tokens / step | peak RSS (MB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for engine, rs in by.items():
        step = _median(rs, "median_step_s")
        roll, sync, rest = (statistics.median(r["profile"][k] for r in rs) for k in ("rollout", "sync", "rest"))
        if engine == "trl":  # no weight sync: TRL generates with the training model itself
            split = f"{roll:.2f} / — / {rest:.2f}" if roll > 0 else "—"
        else:
            split = f"{roll:.2f} / {sync:.2f} / {rest:.2f}"
        vs_hf = f"{hf / step:.2f}" if engine == "vllm" else "—"
        speed = "1.00" if engine == "trl" else f"**{trl / step:.2f}**"
        lines.append(f"| {NAMES[engine]} | {COMPARED[engine]} | {len(rs)} | {step:.2f} | {speed} | {vs_hf} | "
                     f"{_median(rs, 'startup_s'):.1f} | {_median(rs, 'wall_s'):.1f} | {split} | "
                     f"{_median(rs, 'tokens_per_step'):,.0f} | {max(r['peak_rss_mb'] for r in rs):,.0f} |")
    return "\n".join(lines)


def per_run_lines(runs: list[dict]) -> str:
    """Every run's own figures, in launch order, so the medians can be checked."""
    lines = ["| # | engine | median step (s) | start-up (s) | wall (s) | tokens / step | load at start → end | "
             "other processes' CPU during the run (cores) |",
             "|---:|---|---:|---:|---:|---:|---|---:|"]
    for i, r in enumerate(runs, 1):
        lines.append(f"| {i} | {r['engine']} | {r['median_step_s']:.2f} | {r['startup_s']:.1f} | {r['wall_s']:.1f} | "
                     f"{r['tokens_per_step']:,.0f} | {r['load_start']:.1f} → {r['load_end']:.1f} | "
                     f"{r.get('others_cores', float('nan')):.2f} |")
    return "\n".join(lines)


def curves_table(runs: list[dict]) -> str:
    lines = ["| engine | held-out accuracy by step | mean reward, last 10 steps |", "|---|---|---|"]
    for r in sorted(runs, key=lambda r: ORDER.index(r["engine"])):
        acc = ", ".join(f"{s}: {a:.1%}" for s, a in r["accuracy"])
        lines.append(f"| {NAMES[r['engine']]} | {acc} | {statistics.mean(r['rewards'][-10:]):.3f} |")
    return "\n".join(lines)


def plot(runs: list[dict], png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    for r in sorted(runs, key=lambda r: ORDER.index(r["engine"])):
        rw = r["rewards"]
        smooth = [statistics.mean(rw[max(0, i - 4): i + 1]) for i in range(len(rw))]
        a.plot(range(1, len(rw) + 1), smooth, label=NAMES[r["engine"]].replace("`", ""))
        steps, acc = zip(*r["accuracy"])
        b.plot(steps, acc, marker="o", label=NAMES[r["engine"]].replace("`", ""))
    a.set(title="training reward (5-step mean)", xlabel="step")
    b.set(title="held-out greedy accuracy", xlabel="step")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def contention(ph: dict) -> str:
    return contention_note(ph["runs"], ph.get("idle", IDLE), ph["cpus"])


def throughput_section(ph: dict) -> str:
    """One throughput phase's table and how it was measured (also docs/results.md's blocks)."""
    return "\n".join([
        table(ph["runs"]), "",
        f"Measured {ph['date']}, {ph['cpus']} CPU cores ({ph.get('cpu', 'CPU model not recorded')}); random init, {PROMPTS} prompts × {GROUP} completions "
        f"× ≤ {MAX_NEW} new tokens per step, {ph['steps']} steps per run (median of steps 2..{ph['steps']}), "
        f"{ph['repeats']} runs per engine in alternating processes; TRL with gradient_checkpointing=False. "
        f"1-minute load average {ph['load_before']:.1f} before, {ph['load_after']:.1f} after the phase "
        f"(per run: {min(r['load_start'] for r in ph['runs']):.1f}–"
        f"{max(max(r['load_start'], r['load_end']) for r in ph['runs']):.1f}); " + contention(ph) + " Versions: "
        + ", ".join(f"{k} {v}" for k, v in ph["versions"].items()) + ".", ""])


def report(data: dict) -> str:
    """The markdown, rebuilt from everything recorded in the JSON (so phases can run separately)."""
    out = ["# lightning-rlpt vs TRL (benchmarks/vs_trl.py)", ""]
    for key in sorted(data):
        if not key.startswith("throughput_"):
            continue
        ph = data[key]
        shape = SIZES[ph["size"]]
        precision = PRECISIONS[ph.get("precision", "fp32")]["title"]
        out += [f"## Throughput: {shape['layers']} × {shape['hidden']} Llama, vocabulary {shape['vocab']:,}, {precision}", "",
                throughput_section(ph), "<details><summary>every run</summary>", "", per_run_lines(ph["runs"]), "",
                "</details>", ""]
    if "trl_vllm" in data:
        t = data["trl_vllm"]
        out += ["## TRL's own vLLM mode (`use_vllm=True, vllm_mode=\"colocate\"`)", "",
                f"Tried {t['date']} with " + ", ".join(f"{k} {v}" for k, v in t["versions"].items()) + ": "
                + (f"failed after {t['result'].get('steps', 0)} completed steps:" if t["result"].get("error")
                   else "ran."), ""]
        if t["result"].get("error"):
            tb = t["result"].get("traceback", "").splitlines()
            frames = [i for i, line in enumerate(tb) if "/trl/" in line and line.strip().startswith("File")]
            if frames:  # TRL's last frame: where TRL hands the weights to vLLM
                out += ["TRL's last frame:", "", "```", *tb[frames[-1]: frames[-1] + 2], "```", ""]
            out += ["Error:", "", "```", t["result"]["error"][:2000], "```", ""]
    if "curves" in data:
        c = data["curves"]
        out += [f"## Learning curves (warm start, {c['steps']} steps, one run per engine, one seed)", "",
                f"Measured {c['date']}, {c['cpus']} CPU cores ({c.get('cpu', 'CPU model not recorded')}); greedy accuracy on the {c['held_out']} held-out sums; load average "
                f"{c['load_before']:.1f} before, {c['load_after']:.1f} after; " + contention(c), "",
                curves_table(c["runs"]), "", table(c["runs"]), ""]
    return "\n".join(out)
