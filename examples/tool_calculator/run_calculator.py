"""GRPO with a calculator tool vs the same budget without it: 3-digit multiplication on 2 CPU cores.

Both arms start from the shipped warm start (``warm_start/``, built by calculator_sft.py; it calls
the ``multiply`` tool on part of the prompts only) and run the same GRPO budget (steps, prompts,
group size, ``max_new_tokens``) on the training products; only ``tools=[multiply]`` differs.
Held-out accuracy and tool-call frequency are measured before and after on the 200 test products
of ``task.split_pairs()`` by `evaluate.evaluate` (greedy; the tool runs only in the tool arm).
Metrics go to ``runs/tool_calculator/{tools,no_tools}/metrics.csv``; ``comparison.png`` beside
them plots reward and tool-call frequency over training for both arms.

    python examples/tool_calculator/run_calculator.py  # both arms (needs a warm start: docs/agents_example.md)
    python examples/tool_calculator/run_calculator.py --steps 5  # a short run
    python examples/tool_calculator/run_calculator.py --json benchmarks/results/tool_calculator.json  # make calculator
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # examples/: _common
import greedy_eval as evaluate  # noqa: E402  (examples/tool_calculator/greedy_eval.py)
import calculator as task  # noqa: E402
import make_traces  # noqa: E402
import calculator_report  # noqa: E402  (examples/tool_calculator/calculator_report.py)
from _common import write_json  # noqa: E402  (examples/_common.py)

from lightning_rlpt import PromptDataModule, RLModule  # noqa: E402


def build(args: argparse.Namespace, tools: bool) -> tuple[RLModule, PromptDataModule]:
    train, _, _ = task.split_pairs()
    extra = dict(tools=[task.multiply], max_turns=args.max_turns) if tools else {}
    module = RLModule(
        # The tokenizer is built, not loaded: transformers 5's AutoTokenizer gives a Qwen2 config the
        # Qwen2 tokenizer's own pre-tokenizer, which would split the digit chunks and drop newlines.
        args.model, tokenizer=task.build_tokenizer(), reward_funcs=[task.exact_answer], objective="grpo",
        group_size=args.group_size,
        kl_coef=args.kl_coef, lr=args.lr, seed=args.seed,
        generation=dict(max_new_tokens=args.max_new_tokens, temperature=1.0, max_prompt_length=64), **extra,
    )
    data = PromptDataModule(task.rows(train[make_traces.RL_OFFSET:]), batch_size=args.prompts, seed=args.seed)
    return module, data


def run_arm(args: argparse.Namespace, tools: bool) -> dict[str, float]:
    L.seed_everything(args.seed, verbose=False)
    module, data = build(args, tools)
    test = task.split_pairs()[2][:args.eval_n]
    before = measure(module, test, tools)
    out = os.path.join(args.out, "tools" if tools else "no_tools")
    logger = CSVLogger(out, name="", version="")
    trainer = L.Trainer(max_steps=args.steps, logger=logger, log_every_n_steps=1, accelerator="cpu", devices=1,
                        limit_val_batches=0, num_sanity_val_steps=0, enable_checkpointing=False,
                        enable_model_summary=False, enable_progress_bar=False)
    start = time.time()
    trainer.fit(module, datamodule=data)
    seconds = time.time() - start
    after = measure(module, test, tools)
    return {**{f"{k}_before": v for k, v in before.items()}, **{f"{k}_after": v for k, v in after.items()},
            "seconds": seconds, "metrics": os.path.join(logger.log_dir, "metrics.csv")}


def measure(module: RLModule, test: list, tools: bool) -> dict[str, float]:
    """Held-out accuracy and tool calls, greedy and sampled at temperature 1 (one episode per product)."""
    greedy = evaluate.evaluate(module.policy, module.tokenizer, test, tools=tools)
    sampled = evaluate.evaluate(module.policy, module.tokenizer, test, tools=tools, temperature=1.0)
    return {"accuracy": greedy["accuracy"], "calls": greedy["tool_call_frequency"],
            "sampled_accuracy": sampled["accuracy"], "sampled_calls": sampled["tool_call_frequency"]}


def curve(path: str, key: str) -> tuple[list[float], list[float]]:
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r.get(key)]
    return [float(r["step"]) for r in rows], [float(r[key]) for r in rows]


def plot(results: dict[str, dict], png: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for arm, r in results.items():
        axes[0].plot(*curve(r["metrics"], "reward"), label=arm)
        if arm == "tools":
            axes[1].plot(*curve(r["metrics"], "tools/call_frequency"), label=arm, color="C0")
    axes[0].set(title="training reward (exact product)", xlabel="GRPO step")
    axes[1].set(title="tools/call_frequency (sampled episodes)", xlabel="GRPO step", ylim=(0, 1.05))
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    return png


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.join(HERE, "warm_start"))
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps (one rollout each), per arm")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96, help="model tokens per episode, all turns")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--kl-coef", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-n", type=int, default=task.HELD_OUT, help="held-out products evaluated (all 200)")
    parser.add_argument("--arms", default="tools,no_tools", help="comma-separated: tools, no_tools")
    parser.add_argument("--out", default="runs/tool_calculator")
    parser.add_argument("--json", default=None, help="also write the results and the settings to this JSON file")
    args = parser.parse_args(argv)
    results = {arm: run_arm(args, arm == "tools") for arm in args.arms.split(",")}
    png = plot(results, os.path.join(args.out, "comparison.png"))
    n = len(task.split_pairs()[2][:args.eval_n])
    print(calculator_report.table(results, args.steps, n))
    print(f"plot: {png}")
    if args.json:  # benchmarks/headlines.py renders docs/results.md's table and the README's line from it
        settings = {k: getattr(args, k) for k in ("steps", "prompts", "group_size", "max_new_tokens", "lr", "seed")}
        write_json(args.json, {"arms": {a: {k: v for k, v in r.items() if k != "metrics"} for a, r in results.items()},
                               "held_out": n, **settings, "date": datetime.date.today().isoformat(),
                               "cpus": os.cpu_count(), "torch": torch.__version__})
    return results


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
