"""Parts ``grpo_ours`` and ``grpo_trl``: GRPO steps at Qwen2.5-0.5B's shape, lightning-rlpt beside
TRL's ``GRPOTrainer``, like for like.

Both sides run `benchmarks/vs_trl.py`'s own functions (`vs_trl.run_ours` with the HF engine,
`vs_trl.run_trl`) and its settings (`vs_trl_report`: 16 prompts × 8 completions, 32 new tokens,
AdamW lr 3e-5, grad-norm clip 1, β = 0, loss "grpo", temperature 1), both on
``transformers.generate``, no gradient checkpointing on either side, on the same random-init model:
24 layers × 896 wide, 14 heads of 64, 2 KV heads, MLP 4,864, tied embeddings, vocabulary 151,936
(the demo's tokenizer padded with unused tokens), fp32 weights, bf16 autocast
(``precision="bf16-mixed"`` / ``bf16=True``). The dry run: 2 layers × 64, vocabulary 1,000, 2 prompts
× 2 completions × 4 tokens. Each side is its own part (its own process), so
neither sees the other's CUDA memory. The first step pays warm-up; the step time is the median
of the others. With a random init, EOS is almost never sampled: every completion runs to 32 tokens.
"""
from __future__ import annotations

import os
import statistics
import time

from .common import Context, peak_gpu_mb, require

LAYERS, HIDDEN, HEADS, KV_HEADS, MLP, VOCAB = 24, 896, 14, 2, 4864, 151936
DRY = dict(layers=2, hidden=64, heads=1, kv_heads=1, mlp=128, vocab=1000)
STEPS, DRY_STEPS = 4, 2
DRY_WORK = dict(PROMPTS=2, GROUP=2, MAX_NEW=4)  # vs_trl's prompts per step, group size, new tokens
TRL_INSTALL = 'pip install -e ".[bench]" (trl); `make gpu-wheels` carries it to the GPU machine'


def shape(dry_run: bool) -> dict[str, int]:
    if dry_run:
        return DRY
    return dict(layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, mlp=MLP, vocab=VOCAB)


def model_dir(ctx: Context) -> str:
    """The random-init Qwen2 of `shape` (seed 0) with the padded tokenizer, written once per
    check into ``ctx.workdir`` and reused by the other side."""
    import torch
    import task
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from vs_trl import padded_tokenizer

    path = os.path.join(ctx.workdir, "qwen2_05b_shape")
    if os.path.exists(os.path.join(path, "complete")):
        return path
    s = shape(ctx.dry_run)
    config = Qwen2Config(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["mlp"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], max_position_embeddings=128, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID,
                         pad_token_id=task.PAD_ID)
    torch.manual_seed(0)
    with torch.device(ctx.device):  # a 0.5B random init is several times faster on the GPU
        Qwen2ForCausalLM(config).save_pretrained(path)
    padded_tokenizer(s["vocab"]).save_pretrained(path)
    open(os.path.join(path, "complete"), "w").close()
    return path


def prepare(ctx: Context):
    """`vs_trl` with this check's work per step (the dry run's is tiny), the model, the step count."""
    import torch
    import vs_trl
    if ctx.dry_run:
        for name, value in DRY_WORK.items():
            setattr(vs_trl, name, value)  # run_ours / trl_config read these module globals
    path = model_dir(ctx)
    if ctx.cuda:  # the peak reported is the run's, not the random init's (done on the GPU by one side)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    return vs_trl, path, DRY_STEPS if ctx.dry_run else STEPS


def summarise(ctx: Context, side: str, meter, started: float, steps: int) -> None:
    """One record: median step after the first, its rollout share, tokens, peak CUDA memory."""
    import vs_trl
    if len(meter.step_times) < 2:
        raise RuntimeError(f"{side}: only {len(meter.step_times)} step(s) finished; need 2 (the first is warm-up)")
    steady = meter.step_times[1:]
    rollout = [p.get("rollout", 0.0) for p in meter.parts[1:len(meter.step_times)]]
    ctx.emit(case=side, side=side, steps=len(meter.step_times), median_step_s=statistics.median(steady),
             step_times_s=meter.step_times, rollout_s=statistics.median(rollout),
             tokens_per_step=statistics.median(meter.step_tokens[1:]), startup_s=(meter.first_step or started) - started,
             peak_gpu_mb=peak_gpu_mb(ctx.device), shape=shape(ctx.dry_run), prompts=vs_trl.PROMPTS,
             group=vs_trl.GROUP, max_new_tokens=vs_trl.MAX_NEW, wanted_steps=steps)


def run_ours(ctx: Context) -> None:
    vs_trl, path, steps = prepare(ctx)
    meter, started = vs_trl.Meter(), time.perf_counter()
    accelerator = "cuda" if ctx.cuda else "cpu"
    vs_trl.run_ours("hf", "throughput", steps, steps, meter, path,
                    trainer_kwargs=dict(accelerator=accelerator, precision="bf16-mixed"))
    summarise(ctx, "lightning-rlpt (HF generate)", meter, started, steps)


def run_trl(ctx: Context) -> None:
    require("trl", TRL_INSTALL)
    require("datasets", "pip install datasets dill multiprocess")
    vs_trl, path, steps = prepare(ctx)
    meter, started = vs_trl.Meter(), time.perf_counter()
    vs_trl.run_trl("throughput", steps, steps, meter, path, overrides=dict(use_cpu=not ctx.cuda, bf16=True))
    summarise(ctx, "TRL GRPOTrainer (generate)", meter, started, steps)
