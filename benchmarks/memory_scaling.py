"""Peak memory of one GRPO step as the rollout grows: one pass vs micro-batches vs TRL, on this CPU.

Model: Qwen2.5-0.5B's width (896), attention heads (14 query / 2 key-value, head_dim 64), MLP
size (4,864) and 151,936-token vocabulary with tied embeddings, ``--layers`` decoder layers
(Qwen2.5-0.5B has 24), random init, fp32. The tokenizer is the demo's character tokenizer padded
with unused tokens to the vocabulary (as in ``vs_trl.py``); prompts are random digit strings of
``--prompt-len`` tokens. Every completion runs to its full length: the model's generation config
gets ``min_new_tokens = max_new_tokens`` (TRL: ``generation_kwargs``), so EOS is never sampled
and each rollout holds exactly the tokens set (checked: the reward function counts them).

Paths, per rollout size (``--sizes``, each ``PROMPTS x GROUP x COMPLETION``) and gradient
checkpointing off and on:

* ``one-pass``: ``RLModule`` without caps: the whole rollout in one forward/backward.
* ``micro``: ``RLModule(max_tokens_per_micro_batch=--cap)``, the same cap at every size.
* ``trl``: TRL's ``GRPOTrainer`` at the same micro-batch: ``per_device_train_batch_size`` =
  the rows ``--cap`` holds at that size (cap // (prompt + completion)),
  ``gradient_accumulation_steps = steps_per_generation`` = rollout / those rows (one
  generation, one optimizer step), ``optim="adamw_torch"`` (``RLModule``'s ``torch.optim.AdamW``;
  TRL's default is the fused one), the same gradient checkpointing (non-reentrant on both sides).

Both sides: GRPO loss (``loss_type="grpo"``), β = 0 (no reference, no old-policy forward: a
single on-policy pass), lr 1e-6, grad-norm clip 1, temperature 1, dropout off, HF ``generate``
(both generate the whole rollout in one call: since per-row sampling, ``RLModule``'s training caps
no longer cut generation; ``generation=dict(max_batch_rows=...)`` is generation's own cap). Rewards: a pseudo-random function of the completion's ids (non-zero advantages).

Method. Each run is its own process and runs two optimizer steps. The first is a cheap warm-up
(same rollout shape, but one-digit prompts: 2 tokens each): it allocates AdamW's state, which
torch creates lazily at the first step, and warms the libraries up, so the measured step is a
steady-state step, as every step of a run after the first. Before the second step the worker
collects garbage, hands the heap's free pages back to the OS (``malloc_trim``, so memory the
allocator kept from the warm-up is not silently reused), reads its resident set (``VmRSS``) and
resets the kernel's peak counter (``/proc/self/clear_refs``); after it, it reads the peak
(``VmHWM``). Reported per run: **peak RSS** of the measured step (comparable across paths and
frameworks), the **step's own memory** (that peak minus the RSS just before the step:
activations, gradients and temporaries; comparable between the two ``RLModule`` paths; across
frameworks compare peak RSS), the RSS after model and optimizer creation, and the step's wall
time. (Runs before 2026-12-04 13:00 UTC, in ``results/memory_scaling.md``, kept the previous
step's gradients in the "before": ``RLModule`` then freed them only at its next ``zero_grad``;
it now frees them after each optimizer step, as HF's Trainer does.) Runs alternate between
configurations, ``--repeats`` rounds; each figure is the median over the rounds. Before each run
the script waits (at most ``--idle-wait`` s) for other processes to go quiet and records the CPU
they used meanwhile (benchmarks/quiet.py): on a shared machine times are noisier than RSS.

Sizes. The peak has a floor that does not grow with the rollout: weights, AdamW state and the
runtime (~2.4 GB at one layer), the gradients (one copy of the weights) and, at the end of the
backward, the tied embedding's second dense ``[151,936, 896]`` gradient being added to the LM
head's. One-pass memory grows by ~145 KB per token at one layer (fp32: activations and the
head's tiles). For a 4× larger rollout to double the whole peak, the smaller rollout's
per-token memory must exceed that floor: the defaults (one layer, 640-token prompts, 16-token
completions, 30 → 120 sequences: 19.7k → 78.7k tokens) do that, with steps of 0.5–3.5 minutes
on 2 idle cores and a one-pass peak of ~14 GB. TRL's rows take ~6 minutes a step at 31.5k
tokens on this CPU (below), so the committed TRL comparison ran at ``--sizes
3x4x16,3x16x16`` (7.9k → 31.5k tokens; ``results/memory_scaling.md``), where the one-pass
*step's own memory* more than doubles but the whole peak does not. With one layer, gradient checkpointing recomputes that
layer's whole forward in the backward, so it cannot lower the peak: the checkpointing rows show
that the caps hold with checkpointing on, not what checkpointing saves in a deep model.

    python benchmarks/memory_scaling.py --paths one-pass,micro --repeats 2 \
        --results benchmarks/results/memory_scaling_80k  # docs/results.md's first memory table (38 min)
    python benchmarks/memory_scaling.py --sizes 3x4x16,3x16x16 --repeats 2  # with TRL (49 min) -> results/
    python benchmarks/memory_scaling.py --render          # rebuild the .md from the JSON
Needs ``pip install -e ".[bench]"`` for the TRL rows (trl, a benchmark peer, not a dependency).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
from quiet import (IDLE, add_idle_args, cpu_info, read_status_kb, repeat_if_disturbed,  # noqa: E402
                   reset_peak_rss, run_measured, set_idle)
from vs_trl import padded_tokenizer, trl_config, versions  # noqa: E402  (puts examples/arithmetic on sys.path)
from memory_scaling_report import PATHS, report  # noqa: E402

SHAPE = dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
             vocab_size=151_936, tie_word_embeddings=True)
LR = 1e-6


def parse_size(text: str) -> tuple[int, int, int]:
    """``"4x8x32"`` -> (prompts, group, completion tokens)."""
    prompts, group, completion = (int(x) for x in text.lower().split("x"))
    return prompts, group, completion


def trl_rows(cap: int, prompt_len: int, completion: int) -> int:
    """The rows one ``RLModule`` micro-batch holds under ``cap`` padded tokens: TRL's batch size."""
    return max(1, cap // (prompt_len + completion))


# ---------------------------------------------------------------- the child process
def build_model(layers: int, out: str) -> None:
    """A random-init Qwen2 of Qwen2.5-0.5B's width and vocabulary, ``layers`` deep, and its tokenizer."""
    import torch
    import task
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPE, num_hidden_layers=layers, max_position_embeddings=4096, bos_token_id=task.BOS_ID,
                         eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID, use_sliding_window=False)
    Qwen2ForCausalLM(config).save_pretrained(out)


def rows(prompts: int, prompt_len: int, seed: int = 0) -> list[dict]:
    """The two steps' prompts, in order (both trainers run unshuffled): the warm-up's are one digit
    (+ BOS: 2 tokens, a cheap step), the measured step's are digit strings of ``prompt_len`` tokens."""
    rng = random.Random(seed)
    digits = lambda n: "".join(rng.choice("0123456789") for _ in range(n))  # noqa: E731
    return [{"prompt": digits(1)} for _ in range(prompts)] + [{"prompt": digits(prompt_len - 1)} for _ in range(prompts)]


class Probe:
    """Memory and time of the second optimizer step (the first is the warm-up), and the tokens
    each step generated (counted by the reward function both trainers call)."""

    def __init__(self):
        self.step, self.tokens, self.step_tokens, self.fig = 0, 0, [], {}
        self._t0 = None

    def reward(self, prompts, completions, completion_ids, **_) -> list[float]:
        self.tokens += sum(len(c) for c in completion_ids)
        return [(sum(c) % 101) / 100.0 for c in completion_ids]  # pseudo-random: non-zero advantages

    def created(self) -> None:
        self.fig["rss_created_mb"] = read_status_kb("VmRSS") / 1024

    def begin(self) -> None:
        if self._t0 is not None:  # TRL calls on_step_begin per micro-batch
            return
        if self.step == 1:
            gc.collect()
            reset_peak_rss()  # malloc_trim, then VmHWM := VmRSS
            self.fig["rss_before_mb"] = read_status_kb("VmRSS") / 1024
        self._tok0, self._t0 = self.tokens, time.perf_counter()

    def end(self) -> None:
        seconds = time.perf_counter() - self._t0
        self.step_tokens.append(self.tokens - self._tok0)
        if self.step == 1:
            self.fig.update(step_s=seconds, peak_mb=read_status_kb("VmHWM") / 1024)
        else:
            self.fig["warmup_s"] = seconds
        self.step, self._t0 = self.step + 1, None


def run_ours(spec: dict, path: str, tokenizer, probe: Probe) -> dict:
    import lightning as L
    from lightning_rlpt import PromptDataModule, RLModule

    class Hooks(L.Callback):
        def on_train_start(self, trainer, module):
            probe.created()

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            probe.begin()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            probe.end()

    completion = spec["completion"]
    module = RLModule(path, tokenizer=tokenizer, reward_funcs=[probe.reward], objective="grpo",
                      group_size=spec["group"], kl_coef=0.0, lr=LR, seed=0,
                      gradient_checkpointing=spec["ckpt"], max_tokens_per_micro_batch=spec.get("cap"),
                      generation=dict(max_new_tokens=completion, temperature=1.0, chat_template=False,
                                      max_prompt_length=spec["prompt_len"]))
    module.policy.generation_config.min_new_tokens = completion  # EOS never sampled: full-length completions
    data = PromptDataModule(rows(spec["prompts"], spec["prompt_len"]), batch_size=spec["prompts"], shuffle=False)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Hooks()])
    trainer.fit(module, datamodule=data)
    return dict(optimizer=repr(module.optimizers().optimizer.defaults.get("foreach")))


def run_trl(spec: dict, path: str, tokenizer, probe: Probe) -> dict:
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    class Hooks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            probe.created()

        def on_step_begin(self, args, state, control, **kw):
            probe.begin()

        def on_step_end(self, args, state, control, **kw):
            probe.end()

    n = spec["prompts"] * spec["group"]
    rows_per_micro = trl_rows(spec["cap"], spec["prompt_len"], spec["completion"])
    if n % rows_per_micro:
        raise ValueError(f"rollout {n} is not a multiple of TRL's micro-batch {rows_per_micro}: choose --cap")
    accumulation = n // rows_per_micro
    config = trl_config(2, per_device_train_batch_size=rows_per_micro, gradient_accumulation_steps=accumulation,
                        steps_per_generation=accumulation, num_generations=spec["group"],
                        max_completion_length=spec["completion"], learning_rate=LR, optim="adamw_torch",
                        gradient_checkpointing=spec["ckpt"], disable_dropout=True,
                        mask_truncated_completions=False, shuffle_dataset=False, generation_kwargs={"min_new_tokens": spec["completion"]})
    trainer = GRPOTrainer(model=path, reward_funcs=[probe.reward], args=config, processing_class=tokenizer,
                          train_dataset=datasets.Dataset.from_list(rows(spec["prompts"], spec["prompt_len"])),
                          callbacks=[Hooks()])
    trainer.train()
    return dict(trl_rows=rows_per_micro, trl_accumulation=accumulation)


def worker(spec: dict, out: str) -> None:
    import torch

    torch.manual_seed(0)
    load_start = os.getloadavg()[0]
    probe = Probe()
    tokenizer = padded_tokenizer(SHAPE["vocab_size"])
    extra = (run_trl if spec["path"] == "trl" else run_ours)(spec, spec["model_dir"], tokenizer, probe)
    expected = spec["prompts"] * spec["group"] * spec["completion"]
    if probe.step_tokens != [expected, expected]:
        raise RuntimeError(f"steps generated {probe.step_tokens} tokens, expected {expected} each")
    with open(out, "w") as f:
        json.dump({**spec, **probe.fig, **extra, "step_tokens": probe.step_tokens, "torch_threads": torch.get_num_threads(),
                   "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "load_start": load_start, "load_end": os.getloadavg()[0]}, f)


# ---------------------------------------------------------------- the parent
def launch(spec: dict) -> dict:
    """One run in its own process, repeated when other processes disturbed it (`quiet`)."""
    return repeat_if_disturbed(lambda: _launch_once(spec), keep=("step_s", "peak_mb", "others_cores"),
                               label=label(spec))


def label(spec: dict) -> str:
    return f"{spec['path']} {spec['size']} ckpt={'on' if spec['ckpt'] else 'off'}"


def _launch_once(spec: dict) -> dict:
    out = tempfile.mktemp(suffix=".json")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc, seen = run_measured([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec), "--out", out], env)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{label(spec)} failed:\n{proc.stderr[-4000:]}")
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    result.update(seen, child_maxrss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    print(f"  {label(spec):32s} peak {result['peak_mb']:7,.0f} MB (step {result['peak_mb'] - result['rss_before_mb']:6,.0f}"
          f" MB) step {result['step_s']:6.1f} s, others {seen['others_cores']:.2f} cores", file=sys.stderr, flush=True)
    return result


def specs(args) -> list[dict]:
    """One spec per configuration, in the order the runs alternate."""
    out = []
    for ckpt in [{"off": False, "on": True}[c] for c in args.ckpt.split(",")]:
        for text in args.sizes.split(","):
            prompts, group, completion = parse_size(text)
            for path in args.paths.split(","):
                out.append(dict(path=path, size=text, prompts=prompts, group=group, completion=completion,
                                prompt_len=args.prompt_len, layers=args.layers, ckpt=ckpt,
                                cap=None if path == "one-pass" else args.cap))
    return out



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=640, help="prompt tokens (BOS included)")
    p.add_argument("--sizes", default="3x10x16,3x40x16", help="rollouts PROMPTSxGROUPxCOMPLETION, smallest first")
    p.add_argument("--cap", type=int, default=2624, help="max_tokens_per_micro_batch of the micro path (and TRL's rows)")
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--ckpt", default="off,on", help="gradient checkpointing settings to run: off, on or off,on")
    p.add_argument("--fresh", action="store_true", help="discard the runs already in the JSON (else: added to them)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of alternating runs")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--render", action="store_true", help="only rebuild memory_scaling.md from the JSON")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    add_idle_args(p, "run")
    args = p.parse_args()
    set_idle(args)
    if args.worker:
        return worker(json.loads(args.worker), args.out)
    json_path, md_path = (os.path.join(args.results, f"memory_scaling.{ext}") for ext in ("json", "md"))
    if args.render:
        with open(json_path) as f:
            data = json.load(f)
    else:
        data = measure(args)
        if os.path.exists(json_path) and not args.fresh:
            data = merged(json_path, data)
        os.makedirs(args.results, exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(data, f, indent=1)
    text = report(data)
    with open(md_path, "w") as f:
        f.write(text)
    print(text)


def measure(args) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as model_dir:
        build = subprocess_build(args.layers, model_dir)
        todo = [{**s, "model_dir": model_dir} for s in specs(args)]
        runs = [launch(s) for _ in range(args.repeats) for s in todo]
    for r in runs:
        r.pop("model_dir")
    return dict(date=time.strftime("%Y-%m-%d"), cpus=os.cpu_count(), cpu=cpu_info()["model"], versions=versions(),
                idle=dict(IDLE), layers=args.layers, prompt_len=args.prompt_len, sizes=args.sizes, cap=args.cap,
                repeats=args.repeats, build_s=build, seconds=time.perf_counter() - start, runs=runs)


SETTINGS = ("layers", "prompt_len", "sizes", "cap")


def merged(json_path: str, new: dict) -> dict:
    """The runs already recorded plus ``new``'s (more configurations or more rounds of the same
    settings); recorded runs of other settings are refused rather than mixed."""
    with open(json_path) as f:
        old = json.load(f)
    if any(old[k] != new[k] for k in SETTINGS):
        raise SystemExit(f"{json_path} holds runs of other settings ({ {k: old[k] for k in SETTINGS} }): "
                         "pass --fresh to replace them or --results DIR to write elsewhere")
    return {**new, "runs": old["runs"] + new["runs"], "seconds": old["seconds"] + new["seconds"],
            "repeats": old["repeats"] + new["repeats"]}


def subprocess_build(layers: int, model_dir: str) -> float:
    """Write the model in a child process (the parent stays small while the runs go)."""
    import subprocess
    start = time.perf_counter()
    code = f"import sys; sys.path.insert(0, {HERE!r}); import memory_scaling as m; m.build_model({layers}, {model_dir!r})"
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
