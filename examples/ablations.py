"""Ablations of the seed-method callbacks on the arithmetic demo: each callback on its own
against plain GRPO (and six of them together: EntropyGatedKL and AccuracyConditionedKL both own
``kl_coef`` and refuse each other), on fixed seeds.

Writes ``<out>/ablations.md`` (final test accuracy, its per-seed difference to plain GRPO, final
dev accuracy, steps to a target dev accuracy, mean KL, mean entropy) and ``<out>/ablations.png``
(dev accuracy over steps).

Selection and reporting use different sums (``task.split_pairs_with_dev``, split by unordered
pair): validation during training, and so ``ReferenceReset(mode="best")``'s choice of the best
policy, runs on the 200 **dev** sums; the figure reported is one greedy evaluation of the final
policy on the 300 held-out **test** sums after training (a separate Trainer with no callbacks).

    python examples/ablations.py                 # 9 arms × 3 seeds × 120 steps: 6-12 minutes on 2 CPU cores
    python examples/ablations.py --steps 20 --seeds 0 --arms grpo safe
    python examples/ablations.py --json benchmarks/results/ablations.json  # the figures the docs render

Every arm starts from the same warm start, data order and rollout seed; only the callback
differs. Each arm runs once per seed; the table gives the mean (± the spread between seeds). With the
HF engine rollouts are on-policy, so ESSScaledLR leaves the LR unchanged (ρ = 1) by construction: its
arm shows that it is a no-op there, not a gain.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "arithmetic"))
import task  # noqa: E402

import ablations_report  # noqa: E402
from _common import write_json  # noqa: E402  (examples/_common.py)

from lightning_rlpt import HFGenerateEngine, PromptDataModule, RLModule  # noqa: E402
from lightning_rlpt.callbacks import (AccuracyConditionedKL, CurriculumSampler, EntropyGatedKL,  # noqa: E402
                                      ESSScaledLR, ReferenceReset, ResponseWeightedKL, RewardDithering)

ARMS = {
    "grpo": lambda: [],
    "safe": lambda: [EntropyGatedKL(warmup_steps=10, window=10)],
    "reference_reset": lambda: [ReferenceReset(mode="best", every_n_validations=2)],
    "response_weighted_kl": lambda: [ResponseWeightedKL()],
    "accuracy_conditioned_kl": lambda: [AccuracyConditionedKL(kl_min=0.0, kl_max=0.01)],
    "curriculum": lambda: [CurriculumSampler("gaussian", epoch_size=256, dynamic_filtering=True, max_refill_rounds=1)],
    "ess_scaled_lr": lambda: [ESSScaledLR()],
    "reward_dithering": lambda: [RewardDithering(scale=0.05)],
    # EntropyGatedKL and AccuracyConditionedKL both own kl_coef and refuse each other: the
    # combination keeps AKL (listed later, it overrode SAFE's coefficient in every step before).
    "all_six": lambda: [RewardDithering(scale=0.05),
                        CurriculumSampler("gaussian", epoch_size=256, dynamic_filtering=True, max_refill_rounds=1),
                        ResponseWeightedKL(), AccuracyConditionedKL(kl_min=0.0, kl_max=0.01), ESSScaledLR(),
                        ReferenceReset(mode="best", every_n_validations=2)],
}


def run_arm(name: str, args: argparse.Namespace, seed: int) -> dict[str, float]:
    L.seed_everything(seed, verbose=False)
    train, dev, test = task.split_pairs_with_dev()
    module = RLModule(args.model, reward_funcs=[task.exact_answer], group_size=args.group_size, kl_coef=args.kl_coef,
                      lr=args.lr, seed=seed, generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8))
    module.rollout_engine = HFGenerateEngine(module.policy, module.tokenizer.eos_token_id,
                                             module.tokenizer.pad_token_id, return_logprobs=True)
    data = PromptDataModule(task.rows(train), val_data=task.rows(dev[:args.dev_prompts]), batch_size=args.prompts,
                            val_batch_size=300, seed=seed)
    logger = CSVLogger(args.out, name=name, version=f"seed{seed}")
    trainer = L.Trainer(max_steps=args.steps, logger=logger, log_every_n_steps=1, accelerator="cpu", devices=1,
                        callbacks=ARMS[name](), val_check_interval=args.val_every, check_val_every_n_epoch=None,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False)
    start = time.time()
    trainer.fit(module, datamodule=data)
    seconds = time.time() - start
    rows = list(csv.DictReader(open(os.path.join(logger.log_dir, "metrics.csv"))))
    return {**summarise(rows, args.target, seconds), "final_dev": accuracy(module, train, dev[:args.dev_prompts]),
            "test_accuracy": accuracy(module, train, test)}


def accuracy(module: RLModule, train: list, pairs: list) -> float:
    """Greedy accuracy of the policy as training left it (for ReferenceReset: the best-on-dev policy its last
    validation reset to), outside the fit: a fresh Trainer without callbacks or logger, so nothing can react."""
    evaluator = L.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[], enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False)
    data = PromptDataModule(task.rows(train[:1]), val_data=task.rows(pairs), val_batch_size=300)
    return float(evaluator.validate(module, datamodule=data, verbose=False)[0]["val/accuracy"])


def summarise(rows: list[dict[str, str]], target: float, seconds: float) -> dict[str, float]:
    def column(key, shift=0):
        return [(int(r["step"]) + shift, float(r[key])) for r in rows if r.get(key) not in (None, "")]

    val = column("val/accuracy", shift=1)  # logged at the step index before the validation
    reached = [s for s, v in val if v >= target]
    mean = lambda xs: sum(v for _, v in xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"steps_to_target": reached[0] if reached else None,
            "mean_kl": mean(column("kl")), "mean_entropy": mean(column("entropy")), "seconds": seconds,
            "curve": val}


def combine(runs: list[dict]) -> dict:
    """One arm over seeds: means (and the spread of the final test accuracy), the mean dev curve."""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    finals = [r["test_accuracy"] for r in runs]
    reached = [r["steps_to_target"] for r in runs if r["steps_to_target"] is not None]
    by_step = [dict(r["curve"]) for r in runs]
    steps = sorted(set.intersection(*(set(c) for c in by_step)))  # validations every seed ran
    curve = [(step, mean([c[step] for c in by_step])) for step in steps]
    return {"test_accuracy": mean(finals), "test_spread": max(finals) - min(finals), "test_per_seed": finals,
            "final_dev": mean([r["final_dev"] for r in runs]),
            "steps_to_target": statistics.median(reached) if len(reached) == len(runs) else None,
            "mean_kl": mean([r["mean_kl"] for r in runs]), "mean_entropy": mean([r["mean_entropy"] for r in runs]),
            "seconds": sum(r["seconds"] for r in runs), "curve": curve}


def write_report(results: dict[str, dict], args: argparse.Namespace, seconds: float, load_before: float) -> dict:
    """``<out>/ablations.md`` (and ``--json``): what `ablations_report` renders, here and in the docs."""
    data = {"settings": {"steps": args.steps, "prompts": args.prompts, "group_size": args.group_size,
                         "kl_coef": args.kl_coef, "seeds": args.seeds, "dev_prompts": args.dev_prompts,
                         "val_every": args.val_every, "target": args.target, "held_out": task.HELD_OUT,
                         "lr": args.lr},
            "results": results, "seconds": seconds, "load_before": load_before, "load_after": os.getloadavg()[0],
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}
    with open(os.path.join(args.out, "ablations.md"), "w") as f:
        f.write(ablations_report.table(data) + "\n")
    if args.json:
        write_json(args.json, data)
    return data


def plot(results: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        if r["curve"]:
            ax.plot(*zip(*r["curve"]), marker="o", label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("dev accuracy (greedy, 200 sums)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.join(HERE, "arithmetic", "warm_start"))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--kl-coef", type=float, default=0.01,
                        help="the base β the KL callbacks modulate (the demo's 0.001 leaves them little to act on)")
    parser.add_argument("--dev-prompts", type=int, default=task.DEV, help="dev sums validated on (selection, curve)")
    parser.add_argument("--val-every", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.65)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/ablations")
    parser.add_argument("--json", help="also write the results here (benchmarks/results/ablations.json: the docs' tables)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start, load_before = time.time(), os.getloadavg()[0]
    results = {name: combine([run_arm(name, args, seed) for seed in args.seeds]) for name in args.arms}
    data = write_report(results, args, time.time() - start, load_before)
    print(ablations_report.table(data))
    plot(results, os.path.join(args.out, "ablations.png"))
    print(f"table and plot in {args.out}/")
    return results


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
