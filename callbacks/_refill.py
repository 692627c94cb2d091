"""Extra rollouts for dynamic filtering: roll out more prompts and append them to a batch."""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import torch

from lightning_rlpt.data import collate_prompts
from lightning_rlpt.experience import Experience


def rollout_more(module: Any, rows: list[dict[str, Any]], seed: int) -> Experience:
    """Roll out ``rows`` and score them (every RL callback's ``on_rollout_end`` runs on them).
    Nothing else runs: the batch they join goes through ``on_rewards_computed`` once it is
    assembled, so per-sample transforms and controllers see each sample exactly once."""
    exp, _, _ = module.rollout_and_score(collate_prompts(rows), seed)
    return exp


def _pad(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra == 0:
        return t
    pad = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def concat(a: Experience, b: Experience, pad_id: int) -> Experience:
    """Rows of ``a`` then ``b`` (prompts left-padded, completions right-padded to a common width);
    group ids renumbered. Only per-row values are kept (``info`` of ``a``)."""
    out: dict[str, Any] = {}
    p, c = max(a.prompt_ids.shape[1], b.prompt_ids.shape[1]), max(a.completion_ids.shape[1], b.completion_ids.shape[1])
    widths = {"prompt_ids": (p, pad_id, True), "prompt_mask": (p, 0, True), "completion_ids": (c, pad_id, False),
              "completion_mask": (c, 0, False), "behaviour_logprobs": (c, 0.0, False)}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in ("prompts", "completions"):
            out[f.name] = x + y
        elif f.name == "columns":
            out[f.name] = {k: x[k] + y[k] for k in x}
        elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dim() > 0:
            if f.name in widths:
                w, v, left = widths[f.name]
                x, y = _pad(x, w, v, left), _pad(y, w, v, left)
            out[f.name] = torch.cat([x, y.to(x.device)])
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            out[f.name] = None  # set on one side only: not a per-row value of the merged batch
    merged = replace(a, **out)
    merged.group_ids = torch.arange(len(merged) // a.group_size, device=a.group_ids.device).repeat_interleave(a.group_size)
    return merged
