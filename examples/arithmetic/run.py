"""The main demo: GRPO teaches a tiny model 2-digit addition on 2 CPU cores.

It starts from the shipped warm start (``warm_start/``, 35.3 % greedy accuracy on the 300
held-out test sums of ``task.split_pairs()``, split by unordered pair so no test sum's mirror is
trained on), runs GRPO on a standard ``lightning.Trainer``, and prints held-out accuracy before and
after. Nothing is selected on the test sums during the run (the policy reported is the last one).
Metrics go to ``runs/arithmetic/`` (CSV) with a PNG of the curves beside them.

    python examples/arithmetic/run.py            # the full demo (~2-3 minutes)
    python examples/arithmetic/run.py --steps 20 # a shorter run
    python examples/arithmetic/run.py --json benchmarks/results/demo.json  # the figures docs/results.md renders
"""
from __future__ import annotations

import argparse
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
import demo_report  # noqa: E402  (examples/arithmetic/demo_report.py)
import task  # noqa: E402
from _common import write_json  # noqa: E402  (examples/_common.py)

from lightning_rlpt import PromptDataModule, RLModule  # noqa: E402
from lightning_rlpt.cli.plotting import plot_metrics  # noqa: E402


def build(args: argparse.Namespace) -> tuple[RLModule, PromptDataModule]:
    train_pairs, held_out = task.split_pairs()
    module = RLModule(
        args.model, reward_funcs=[task.exact_answer], objective="grpo", group_size=args.group_size,
        kl_coef=args.kl_coef, lr=args.lr, seed=args.seed,
        generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8),
    )
    data = PromptDataModule(task.rows(train_pairs), val_data=task.rows(held_out), batch_size=args.prompts,
                            val_batch_size=300, seed=args.seed)
    return module, data


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.join(HERE, "warm_start"))
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps (one rollout each)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--kl-coef", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/arithmetic")
    parser.add_argument("--accelerator", default="cpu", help="Lightning accelerator: cpu, cuda or auto")
    parser.add_argument("--json", default=None, help="also write the result and the settings to this JSON file")
    args = parser.parse_args(argv)
    L.seed_everything(args.seed, verbose=False)
    module, data = build(args)
    logger = CSVLogger(args.out, name="", version="")
    trainer = L.Trainer(max_steps=args.steps, logger=logger, log_every_n_steps=1, accelerator=args.accelerator, devices=1,
                        val_check_interval=max(1, args.steps // 4), check_val_every_n_epoch=None,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_model_summary=False)
    before = trainer.validate(module, datamodule=data, verbose=False)[0]["val/accuracy"]
    start = time.time()
    trainer.fit(module, datamodule=data)
    seconds = time.time() - start
    after = trainer.validate(module, datamodule=data, verbose=False)[0]["val/accuracy"]
    png = plot_metrics(os.path.join(logger.log_dir, "metrics.csv"), os.path.join(logger.log_dir, "curves.png"))
    print("\n" + demo_report.summary({"before": before, "after": after, "steps": args.steps, "seconds": seconds}))
    print(f"metrics: {os.path.join(logger.log_dir, 'metrics.csv')}\ncurves:  {png}")
    result = {"before": before, "after": after, "seconds": seconds}
    if args.json:  # benchmarks/headlines.py renders the README's and docs/results.md's demo figures from it
        settings = {k: getattr(args, k) for k in ("steps", "prompts", "group_size", "lr", "kl_coef", "seed")}
        write_json(args.json, {**result, **settings, "date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
                               "torch": torch.__version__, "threads": torch.get_num_threads(),
                               "load_after": os.getloadavg()[0]})
    return result


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
