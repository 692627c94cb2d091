"""TRL 1.16's own code, run on given tensors: ``GRPOTrainer._compute_loss`` on a stand-in trainer,
and the importance-sampling and reward→advantage blocks of ``_generate_and_score_completions``.

Nothing is transcribed: the stand-in is a ``GRPOTrainer`` made without ``__init__`` that carries the
attributes ``__init__`` would derive from a real ``trl.GRPOConfig`` (the same assignments, read from
the config), and a one-process accelerator. The two blocks that live inside the long generation
method are cut out of TRL's installed source between lines of its own (`_block`) and run with
TRL's module globals, so a change in TRL's code changes what runs here.
"""
from __future__ import annotations

import inspect
import textwrap
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch

trl = __import__("pytest").importorskip("trl", reason="the parity tests run TRL's own code: pip install trl==1.16.0")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer import grpo_trainer  # noqa: E402


def trl_config(**fields: Any) -> GRPOConfig:
    """A real ``GRPOConfig`` for CPU (TRL's bf16 default needs a GPU)."""
    return GRPOConfig(**{"bf16": False, "use_cpu": True, "output_dir": "unused", "report_to": "none", **fields})


class OneProcess:
    """The accelerator calls `_compute_loss` makes, for one process: gathers and reductions are identities."""

    num_processes, process_index, sync_gradients, is_main_process = 1, 0, True, True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def stand_in(config: GRPOConfig, logps: torch.Tensor, entropies: torch.Tensor, use_vllm: bool) -> GRPOTrainer:
    """A ``GRPOTrainer`` without ``__init__`` whose forward returns ``logps`` and ``entropies``.
    ``use_vllm``: the rows carry a sampler's log-probs (TRL has them with vLLM only)."""
    t = object.__new__(GRPOTrainer)
    t.args, t.accelerator, t.model = config, OneProcess(), SimpleNamespace(training=True)
    # GRPOTrainer.__init__'s assignments from the config (trl/trainer/grpo_trainer.py)
    for name in ("loss_type", "importance_sampling_level", "beta", "top_entropy_quantile", "entropy_coef",
                 "use_adaptive_entropy", "max_completion_length", "num_generations", "off_policy_mask_threshold",
                 "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "scale_rewards",
                 "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "multi_objective_aggregation",
                 "mask_truncated_completions"):
        setattr(t, name, getattr(config, name))
    t.epsilon_low = config.epsilon
    t.epsilon_high = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    t.use_vllm, t.aux_loss_enabled = use_vllm, False
    t._entropy_bonus_enabled = t.entropy_coef != 0.0 or t.use_adaptive_entropy
    t._last_world_entropy, t._entropy_window_stats = float("inf"), None
    t.current_gradient_accumulation_steps = config.gradient_accumulation_steps
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, entropies, None)
    return t


def compute_loss(config: GRPOConfig, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float], dict]:
    """TRL's loss on ``batch`` (`parity_batch`'s tensors), its logged metrics and the leaves' gradients."""
    logp = batch["logp"].clone().requires_grad_(True)
    entropy = batch["entropy"].clone().requires_grad_(True)
    behaviour = batch.get("behaviour")
    mask = batch["mask"] * (~batch["truncated"]).unsqueeze(-1) if config.mask_truncated_completions else batch["mask"]
    trainer = stand_in(config, logp, entropy, use_vllm=behaviour is not None)
    n, c = mask.shape
    inputs = dict(prompt_ids=torch.zeros(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1),
                  completion_ids=torch.zeros(n, c, dtype=torch.long), completion_mask=mask,
                  advantages=batch["advantages"], old_per_token_logps=batch.get("old"),
                  ref_per_token_logps=batch.get("ref"), num_items_in_batch=mask.sum())
    if behaviour is not None and config.vllm_importance_sampling_correction:  # TRL computes it only then
        old = batch["old"] if batch.get("old") is not None else batch["logp"]
        inputs["importance_sampling_ratio"] = importance_sampling_ratio(trainer, old, behaviour, mask)
        inputs["old_per_token_logps"] = old  # TRL with vLLM always recomputes π_old
    loss = trainer._compute_loss(None, inputs)
    loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss.detach(), metrics, {"logp": logp.grad, "entropy": entropy.grad}


def _block(method, first: str, last: str) -> str:
    """TRL's source lines of ``method`` from the line containing ``first`` to the line containing
    ``last`` (both included), dedented: a block of a long method, run as TRL wrote it."""
    lines = inspect.getsource(method).splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return textwrap.dedent("\n".join(lines[start:end + 1]))


_GENERATE = GRPOTrainer._generate_and_score_completions
IS_BLOCK = _block(_GENERATE, "per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
                  "f\"Unknown vLLM importance sampling level")
IS_BLOCK += "\n        )"  # the raise's closing parenthesis, on the line after the message
ADVANTAGE_BLOCK = _block(_GENERATE, "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
                         "advantages = torch.nan_to_num(advantages, nan=0.0)")


def _run(block: str, **names: Any) -> dict[str, Any]:
    scope = {**vars(grpo_trainer), **names}
    exec(compile(block, grpo_trainer.__file__, "exec"), scope)  # TRL's own lines, TRL's own globals
    return scope


def importance_sampling_ratio(trainer: GRPOTrainer, old: torch.Tensor, behaviour: torch.Tensor,
                              mask: torch.Tensor) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio (``[N, C]`` token modes, ``[N, 1]`` sequence modes)."""
    return _run(IS_BLOCK, self=trainer, old_per_token_logps=old, sampling_per_token_logps=behaviour,
                mask=mask)["vllm_importance_sampling_ratio"]


def advantages(config: GRPOConfig, rewards_per_func: torch.Tensor) -> torch.Tensor:
    """TRL's advantages from ``[N, F]`` scores (NaN: the function returned None)."""
    functions = rewards_per_func.shape[1]
    weights = config.reward_weights if config.reward_weights is not None else [1.0] * functions
    trainer = SimpleNamespace(multi_objective_aggregation=config.multi_objective_aggregation,
                              scale_rewards=config.scale_rewards, reward_funcs=[None] * functions,
                              reward_weights=torch.tensor(weights, dtype=torch.float32))
    return _run(ADVANTAGE_BLOCK, self=trainer, rewards_per_func=rewards_per_func, device="cpu",
                num_generations=config.num_generations)["advantages"]


METRICS_BLOCK = _block(_GENERATE, "delta = torch.abs(old_per_token_logps - sampling_per_token_logps)",
                       "nanmax(self.accelerator.gather(max_importance_sampling_ratio)).item()")
METRICS_BLOCK += "\n)"  # the append's closing parenthesis


def sampling_metrics(config: GRPOConfig, old: torch.Tensor, behaviour: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """TRL's ``sampling/*`` metrics of a rollout (its vLLM branch), from its own lines."""
    trainer = stand_in(config, old, old, use_vllm=True)
    ratio = importance_sampling_ratio(trainer, old, behaviour, mask)
    _run(METRICS_BLOCK, self=trainer, old_per_token_logps=old, sampling_per_token_logps=behaviour,
         completion_mask=mask, tool_mask=None, device="cpu", mode="train", vllm_importance_sampling_ratio=ratio,
         sequence_level_is=config.vllm_importance_sampling_mode.startswith("sequence"))
    return {k: v[-1] for k, v in trainer._metrics["train"].items()}
