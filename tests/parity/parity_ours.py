"""This project's side of the parity tests: `RLModule.loss` on the same tensors TRL gets.

The module is built from the same fields as TRL's config, through `from_grpo_config`; its policy
forward is replaced by the batch's log-probs and entropies (float64 leaves), so what is compared is
everything after the forward: the objective, the KL term, the corrections, the entropy terms, the
aggregation and the metrics.
"""
from __future__ import annotations

from typing import Any

import torch

import tiny_task as task
from lightning_rlpt import RLModule
from lightning_rlpt.compat.trl import from_grpo_config
from lightning_rlpt.experience import Experience

F64 = torch.float64
_MODULES: dict[str, RLModule] = {}


def parity_batch(seed: int, rows: int = 6, cols: int = 5, group: int = 3, off_policy: bool = False,
                 behaviour: bool = False, nan_behaviour: bool = False, truncated: bool = False) -> dict[str, Any]:
    """Log-probs, π_old (or None: on-policy), π_ref, the sampler's (or None), entropies, a ragged
    mask with a row that has no trained token, advantages of both signs and the truncated flags."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, cols, dtype=F64, generator=g) * 2 - 0.05
    mask = torch.ones(rows, cols, dtype=F64)
    mask[1, 3:], mask[4, 1:] = 0, 0
    out = dict(logp=logp, mask=mask, entropy=torch.rand(rows, cols, dtype=F64, generator=g) * 3,
               ref=logp + 0.3 * torch.randn(rows, cols, dtype=F64, generator=g),
               advantages=torch.randn(rows, dtype=F64, generator=g), group=group,
               truncated=torch.tensor([i % 3 == 2 and truncated for i in range(rows)]))
    if off_policy:
        out["old"] = logp + 0.25 * torch.randn(rows, cols, dtype=F64, generator=g)
    if behaviour:
        base = out.get("old", logp)
        out["behaviour"] = base + 0.4 * torch.randn(rows, cols, dtype=F64, generator=g)
        if nan_behaviour:
            out["behaviour"][0, 1] = float("nan")
    return out


def module_for(fields: dict[str, Any], model_dir: str) -> RLModule:
    """`RLModule` from TRL's fields (cached: building loads the tiny model)."""
    key = repr(sorted(fields.items()))
    if key not in _MODULES:
        args = from_grpo_config({"gradient_checkpointing": False, **fields})
        _MODULES[key] = RLModule(model_dir, reward_funcs=[task.exact_answer], **args.module)
    return _MODULES[key]


def our_loss(module: RLModule, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float], dict]:
    """`RLModule.loss` on ``batch``: (loss, metrics, the leaves' gradients)."""
    leaves = {"logp": batch["logp"].clone().requires_grad_(True),
              "entropy": batch["entropy"].clone().requires_grad_(True)}
    return _loss(module, batch, lambda: (leaves["logp"], leaves["entropy"]), leaves)


def our_fused_loss(module: RLModule, batch: dict[str, Any], hidden: torch.Tensor, weight: torch.Tensor,
                   targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, dict[str, float], dict]:
    """`RLModule.loss` with the policy's log-probs from this project's fused head (the chunked
    PyTorch implementation) on ``hidden`` and ``weight``: (loss, metrics, their gradients)."""
    from lightning_rlpt.kernels import fused_logprobs

    leaves = {"hidden": hidden.clone().requires_grad_(True), "weight": weight.clone().requires_grad_(True)}
    return _loss(module, batch, lambda: fused_logprobs(leaves["hidden"], leaves["weight"], targets,
                                                       temperature=temperature, impl="chunked"), leaves)


def _loss(module: RLModule, batch: dict[str, Any], forward, leaves: dict[str, torch.Tensor]):
    mask = batch["mask"]
    n, c = mask.shape
    exp = Experience(prompt_ids=torch.zeros(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1),
                     completion_ids=torch.zeros(n, c, dtype=torch.long), completion_mask=mask,
                     group_ids=torch.arange(n) // batch["group"], group_size=batch["group"], prompts=[""] * n,
                     completions=[""] * n, truncated=batch["truncated"], behaviour_logprobs=batch.get("behaviour"),
                     old_logprobs=batch.get("old"), ref_logprobs=batch["ref"] if module.knobs.kl_coef > 0 else None,
                     advantages=batch["advantages"])
    module.policy_logprobs = lambda exp, with_entropy=False, entropy_grad=False: forward()
    loss, metrics = module.loss(exp)
    loss.backward()
    return loss.detach(), metrics, {k: v.grad for k, v in leaves.items()}
