"""`Experience`: the one record that flows from the rollout to the loss (see docs/architecture.md)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch


@dataclass
class Experience:
    """G completions for each of B prompts, as padded tensors of N = B·G rows.

    Rows of one group are contiguous: rows ``g*G .. g*G+G-1`` answer prompt ``g``.
    Prompts are left-padded and completions right-padded, so ``cat([prompt_ids,
    completion_ids], 1)`` is the model input.

    Attributes:
        prompt_ids: ``[N, P]`` long, left-padded.
        prompt_mask: ``[N, P]`` 1 on real prompt tokens.
        completion_ids: ``[N, C]`` long, right-padded (EOS kept when generated).
        completion_mask: ``[N, C]`` 1 on tokens that are trained on.
        group_ids: ``[N]`` index of the prompt within the batch.
        group_size: G.
        prompts: the N prompt strings (each repeated G times).
        completions: the N decoded completions.
        columns: extra dataset columns, each a list of N values, passed to reward functions.
        truncated: ``[N]`` bool, completion hit ``max_new_tokens`` without EOS.
        behaviour_logprobs: ``[N, C]`` log-probs of the sampled tokens under the engine that
            sampled them (None when the engine does not report them).
        old_logprobs: ``[N, C]`` log-probs under the policy at rollout time, recomputed by the
            learner; None when the first update is on-policy and they equal the detached
            current log-probs.
        ref_logprobs: ``[N, C]`` log-probs under the reference policy (None without KL).
        rewards_per_func: ``[N, F]`` raw score of each reward function.
        rewards: ``[N]`` weighted sum of ``rewards_per_func`` (callbacks may edit it).
        advantages: ``[N]`` (or ``[N, C]`` for token-level estimators).
        sample_weights: ``[N]`` per-sequence loss weights (curricula), default 1.
        token_weights: ``[N, C]`` per-token loss weights, default 1.
        kl_weights: ``[N]`` per-sequence KL coefficients multiplying the module's ``kl_coef``.
        policy_version: optimizer steps taken by the policy that generated this batch.
        info: free-form per-batch values that callbacks share (documented by each callback).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    group_ids: torch.Tensor
    group_size: int
    prompts: list[str]
    completions: list[str]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    truncated: torch.Tensor | None = None
    behaviour_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    rewards_per_func: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    sample_weights: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    kl_weights: torch.Tensor | None = None
    policy_version: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        # Right padding after a completion never influences earlier positions of a causal LM,
        # so every completion slot can be attended.
        return torch.cat([self.prompt_mask, torch.ones_like(self.completion_mask)], dim=1)

    def select(self, rows: torch.Tensor | list[int]) -> "Experience":
        """The experience restricted to ``rows`` (tensors, lists and columns alike)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == len(self):
                out[f.name] = value[rows.to(value.device)]
            elif f.name in ("prompts", "completions"):
                out[f.name] = [value[i] for i in rows.tolist()]
            elif f.name == "columns":
                out[f.name] = {k: [v[i] for i in rows.tolist()] for k, v in value.items()}
            elif f.name == "info":
                out[f.name] = {k: (v[rows.to(v.device)] if isinstance(v, torch.Tensor) and v.dim() > 0
                                   and v.shape[0] == len(self) else v) for k, v in value.items()}
        return replace(self, **out)

    def select_groups(self, groups: torch.Tensor | list[int]) -> "Experience":
        """Keep whole groups (e.g. dynamic filtering); group ids are renumbered 0..k-1."""
        groups = torch.as_tensor(groups, dtype=torch.long).tolist()
        g = self.group_size
        rows = [gi * g + j for gi in groups for j in range(g)]
        out = self.select(rows)
        out.group_ids = torch.arange(len(groups), device=self.group_ids.device).repeat_interleave(g)
        return out
