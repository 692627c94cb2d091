"""A GRPO step before and after a change of this repository, like for like, on this machine.

The step is `vs_trl.py`'s throughput step on the 32k vocabulary (a 4 × 256 Llama, 16 prompts × 8
completions × 32 new tokens, β = 0, fp32), on the HF engine and on ``VLLMRollout``: that script's
``--worker`` in its own process, with ``PYTHONPATH`` at one side's library: ``--before`` (a commit,
extracted) or this working tree. The harness is this tree's on both sides, so only the library
differs. The sides alternate, ``--reps`` runs each (a slow spell of the machine hits both); a run's
step is the median of its steps after the first, split into rollout, weight sync and the rest (the
update); a side's figure is the median over its runs. The fp32 GEMM peak is measured in the same
invocation (`floor.py`, before and after the runs; the higher counts, since a slow reading would
lengthen the floor and flatter the ratios), so the ratios to the floor are of one host, whatever
host `floor.json` was measured on. They are computed when the table is rendered (`floors`).

    python benchmarks/step_before_after.py --before 0a48329 --reps 3   # ~15 minutes on 2 CPU cores

What it does not show: another shape, bf16, or a GPU; the floor counts matrix products only.
Writes ``benchmarks/results/step_before_after.json`` and prints a markdown table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import floor  # noqa: E402  (benchmarks/floor.py)
import vs_trl  # noqa: E402
from quiet import add_idle_args, cpu_info, set_idle  # noqa: E402
from seed_per_prompt_rollout import extract  # noqa: E402

PARTS = ("step", "rollout", "sync", "rest")


def run_side(tree: str, engine: str, steps: int) -> dict:
    """One vs_trl worker run of ``engine`` importing the library from ``tree``: its median step and parts."""
    r = vs_trl.launch(engine, "throughput", steps, 0, size="vocab32k", precision="fp32", library=tree)
    return {"step": r["median_step_s"], **r["profile"], "peak_rss_mb": r["peak_rss_mb"], "wall_s": r["process_wall_s"],
            **{k: r[k] for k in ("waited_s", "busy_before", "others_cores", "discarded")}}


def summary(runs: list[dict]) -> dict:
    """A side's medians over its runs (computed when rendered: the JSON keeps the runs)."""
    return {k: statistics.median(r[k] for r in runs) for k in (*PARTS, "peak_rss_mb")}


def floors(result: dict) -> dict[str, float]:
    """Seconds of the step's, the rollout's and the update's floors at the higher peak measured."""
    flops = floor.floor_flops(floor.reference_step())
    peak = max(result["fp32_peak_gflops"]) * 1e9
    return {k: flops[k] / peak for k in ("step", "rollout", "update")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the commit to compare with")
    p.add_argument("--engines", default="hf,vllm")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", default=os.path.join(HERE, "results", "step_before_after.json"))
    add_idle_args(p)
    args = p.parse_args()
    set_idle(args)
    import torch
    peaks = [floor.time_mm(4096, torch.float32, "cpu", reps=5, warmup=2)["flop_per_s"]]
    runs: dict[str, dict[str, list[dict]]] = {e: {"before": [], "after": []} for e in args.engines.split(",")}
    with tempfile.TemporaryDirectory() as old:
        trees = {"before": extract(args.before, old), "after": ROOT}
        for rep in range(args.reps):
            for engine in runs:
                for side, tree in trees.items():
                    runs[engine][side].append(run_side(tree, engine, args.steps))
                    r = runs[engine][side][-1]
                    print(f"  rep {rep} {engine} {side}: step {r['step']:.2f} s (rollout {r['rollout']:.2f}, "
                          f"update {r['rest']:.2f})", file=sys.stderr, flush=True)
    peaks.append(floor.time_mm(4096, torch.float32, "cpu", reps=5, warmup=2)["flop_per_s"])
    result = dict(before_commit=args.before, measured=datetime.date.today().isoformat(),
                  cpu=cpu_info()["model"], cpus=os.cpu_count(), fp32_peak_gflops=[x / 1e9 for x in peaks],
                  steps=args.steps, reps=args.reps,
                  command=" ".join(["python", "benchmarks/step_before_after.py", *sys.argv[1:]]),
                  engines={e: {side: {"runs": rs} for side, rs in sides.items()}
                           for e, sides in runs.items()})
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(table(result))


def table(result: dict) -> str:
    """The markdown table of a `main` result (docs/results.md renders it through headlines.py)."""
    lines = ["| engine | side | step (s) | its runs (s) | × floor | rollout (s) | × floor | update (s) | × floor | "
             "peak RSS (MB) |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    names = {"hf": "HF engine", "vllm": "`VLLMRollout`"}
    fl = floors(result)
    for engine, sides in result["engines"].items():
        for side, kept in sides.items():
            s = summary(kept["runs"])
            label = f"before ({result['before_commit']})" if side == "before" else "after"
            x = {"step": s["step"] / fl["step"], "rollout": s["rollout"] / fl["rollout"],
                 "update": s["rest"] / fl["update"]}
            spread = "–".join(f"{f(r['step'] for r in kept['runs']):.2f}" for f in (min, max))
            lines.append(f"| {names.get(engine, engine)} | {label} | {s['step']:.2f} | {spread} | {x['step']:.1f}× | "
                         f"{s['rollout']:.2f} | {x['rollout']:.1f}× | {s['rest']:.2f} | {x['update']:.1f}× | "
                         f"{s['peak_rss_mb']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
