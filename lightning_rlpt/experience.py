"""`Experience`: the one record that flows from the rollout to the loss (see docs/architecture.md)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

import torch

from .padding import pad_width

# Per-row tensors whose width is a token axis, and how each is padded when rows of different
# widths are joined: (pad value, pad on the left).
_TOKEN_AXES = {"prompt_ids": (None, True), "prompt_mask": (0, True), "completion_ids": (None, False),
               "completion_mask": (0, False), "behaviour_logprobs": (0.0, False), "old_logprobs": (0.0, False),
               "ref_logprobs": (0.0, False), "token_weights": (0.0, False)}
_PROMPT_AXES = ("prompt_ids", "prompt_mask")


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
        rewards_per_func: ``[N, F]`` raw score of each reward function; NaN where it returned None
            ("does not apply to this sample", docs/rewards.md).
        scores: ``[N]`` the weighted sum of ``rewards_per_func`` as scored: what success, pass
            rates and filters read. Callbacks leave it alone.
        rewards: ``[N]`` the reward advantages are computed from: ``scores`` plus any
            callback's edits (e.g. dithering).
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
    scores: torch.Tensor | None = None
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

    def trained_mask(self, mask_truncated: bool) -> torch.Tensor:
        """``[N, C]`` float: 1 on the tokens the loss trains on. The one definition the loss
        (`RLModule.loss_mask`) and the callbacks' statistics share, so a callback never measures
        tokens the loss does not see.

        Args:
            mask_truncated: drop every token of a truncated row (``RLModule``'s
                ``mask_truncated_completions``); rows of ``completion_mask`` 0 (padding, tool and
                environment tokens) are never trained on.

        Examples:
            >>> exp = Experience(torch.zeros(2, 1), torch.ones(2, 1), torch.zeros(2, 2), torch.ones(2, 2),
            ...                  torch.zeros(2), 2, ["p", "p"], ["a", "b"], truncated=torch.tensor([False, True]))
            >>> exp.trained_mask(True).tolist()
            [[1.0, 1.0], [0.0, 0.0]]
        """
        mask = self.completion_mask.float()
        if not mask_truncated:
            return mask
        if self.truncated is None:
            raise ValueError("mask_truncated_completions needs experience.truncated, which this experience lacks: "
                             "set it in the rollout (a [N] bool, True where max_new_tokens was hit without EOS)")
        return mask * (~self.truncated.bool()).float().unsqueeze(-1).to(mask.device)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        # Right padding after a completion never influences earlier positions of a causal LM,
        # so every completion slot can be attended.
        return torch.cat([self.prompt_mask, torch.ones_like(self.completion_mask)], dim=1)

    def map_rows(self, tensor_fn: Callable[[torch.Tensor], torch.Tensor],
                 list_fn: Callable[[list], list]) -> "Experience":
        """A copy with every per-row value transformed: ``tensor_fn`` on ``[N, ...]`` tensors
        (those of ``info`` too), ``list_fn`` on prompts, completions and each column. The one
        loop over the fields, shared by `select` and `to`."""
        n = len(self)

        def rows(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
                return tensor_fn(value)
            return value

        out = {f.name: rows(getattr(self, f.name)) for f in fields(self)}
        out["prompts"], out["completions"] = list_fn(self.prompts), list_fn(self.completions)
        out["columns"] = {k: list_fn(v) for k, v in self.columns.items()}
        out["info"] = {k: rows(v) for k, v in self.info.items()}
        return replace(self, **out)

    def select(self, rows: torch.Tensor | list[int]) -> "Experience":
        """The experience restricted to ``rows`` (tensors, lists and columns alike)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        index = rows.tolist()
        return self.map_rows(lambda t: t[rows.to(t.device)], lambda values: [values[i] for i in index])

    def to(self, device: torch.device | str) -> "Experience":
        return self.map_rows(lambda t: t.to(device), list)

    def trim(self) -> "Experience":
        """The experience without all-padding columns: prompt columns left of the longest real
        prompt, completion columns right of the last trained token (at least one kept). Exact for
        a causal LM: left padding is masked and positions skip it; later columns never change
        earlier ones. Token-level tensors (``advantages`` or ``info`` values of width C included)
        are cut alike."""
        keep_p = max(1, int(self.prompt_mask.sum(1).max())) if len(self) else self.prompt_ids.shape[1]
        tail = (self.completion_mask != 0).any(0).nonzero()
        keep_c = max(1, int(tail.max()) + 1) if len(tail) else 1
        p, c = self.prompt_ids.shape[1], self.completion_ids.shape[1]
        if keep_p == p and keep_c == c:
            return self

        def cut(value: Any) -> Any:  # a completion-token axis
            if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == (len(self), c):
                return value[:, :keep_c]
            return value

        out = {name: cut(getattr(self, name)) for name in (*_TOKEN_AXES, "advantages") if name not in _PROMPT_AXES}
        out.update({name: getattr(self, name)[:, p - keep_p:] for name in _PROMPT_AXES})
        return replace(self, **out, info={k: cut(v) for k, v in self.info.items()})

    def select_groups(self, groups: torch.Tensor | list[int]) -> "Experience":
        """Keep whole groups (e.g. dynamic filtering); group ids are renumbered 0..k-1."""
        groups = torch.as_tensor(groups, dtype=torch.long).tolist()
        g = self.group_size
        out = self.select([gi * g + j for gi in groups for j in range(g)])
        out.group_ids = torch.arange(len(groups), device=self.group_ids.device).repeat_interleave(g)
        return out

    def concat(self, other: "Experience", pad_id: int) -> "Experience":
        """Rows of ``self`` then ``other`` (token axes padded to a common width with ``pad_id``
        for ids, 0 elsewhere); group ids renumbered. A tensor set on one side only is not a
        per-row value of the joined batch and is dropped. ``info`` is merged per key by
        `merge_info`: per-row values joined, per-batch values kept where both sides agree."""
        out: dict[str, Any] = {}
        for f in fields(self):
            x, y = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("prompts", "completions"):
                out[f.name] = x + y
            elif f.name == "columns":
                out[f.name] = {k: x[k] + y[k] for k in x}
            elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dim() > 0:
                if f.name in _TOKEN_AXES:
                    value, left = _TOKEN_AXES[f.name]
                    value = pad_id if value is None else value
                    width = max(x.shape[1], y.shape[1])
                    x, y = pad_width(x, width, value, left), pad_width(y, width, value, left)
                out[f.name] = torch.cat([x, y.to(x.device)])
            elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
                out[f.name] = None
        merged = replace(self, **out, info=merge_info(self.info, other.info, len(self), len(other)))
        merged.group_ids = torch.arange(len(merged) // self.group_size,
                                        device=self.group_ids.device).repeat_interleave(self.group_size)
        return merged


def merge_info(a: dict[str, Any], b: dict[str, Any], n_a: int, n_b: int) -> dict[str, Any]:
    """``info`` of two experiences of ``n_a`` and ``n_b`` rows joined (`Experience.concat`).

    A key holding a per-row tensor on both sides (first dimension the side's row count: episode
    counts ``turns``/``tool_calls``, ``ref_entropy``) is joined, a second (token) axis padded
    with 0 on the right to the wider side. Any other value (per-batch: a scalar, a string) is
    kept when both sides hold the same, else dropped, as is a key present on one side only:
    neither describes the joined batch, and a silently stale value is worse than a missing one
    (its reader raises `KeyError`, naming what is missing).

    Examples:
        >>> t = torch.tensor
        >>> merge_info({"turns": t([1, 2]), "tag": "x", "k": 1}, {"turns": t([3]), "tag": "x", "k": 2}, 2, 1)
        {'turns': tensor([1, 2, 3]), 'tag': 'x'}
    """
    out: dict[str, Any] = {}
    for key in a.keys() & b.keys():
        x, y = a[key], b[key]
        if _per_row(x, n_a) and _per_row(y, n_b) and x.dim() == y.dim() and (x.dim() <= 2 or x.shape[1:] == y.shape[1:]):
            if x.dim() == 2:
                width = max(x.shape[1], y.shape[1])
                x, y = pad_width(x, width, 0, False), pad_width(y, width, 0, False)
            out[key] = torch.cat([x, y.to(x.device)])
        elif not _per_row(x, n_a) and not _per_row(y, n_b) and _same(x, y):
            out[key] = x
    return {k: out[k] for k in a if k in out}  # self's key order


def _per_row(value: Any, n: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and bool(
            torch.equal(x.cpu(), y.cpu()))
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - values without a plain equality are not shared
        return False
