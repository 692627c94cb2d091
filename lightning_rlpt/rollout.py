"""Rollout engines: turn prompt token ids into sampled completions.

`RolloutEngine` is the interface a rollout callback implements (the vLLM one lives in
``lightning_rlpt.callbacks``); `HFGenerateEngine` is the default, built on
``transformers.generate`` with the policy being trained, so it never needs a weight sync.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .distributed import is_sharded, world_size
from .sampling import SamplingConfig


@dataclass
class RolloutOutput:
    """One completion per prompt row, without padding.

    ``completion_ids[i]`` ends with EOS when the model stopped by itself. ``logprobs[i]`` (when
    the engine reports them) holds the sampling log-prob of each token of ``completion_ids[i]``.
    """

    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None = None


class RolloutEngine:
    """What the module needs from an engine. ``policy_version`` is the optimizer step whose
    weights the engine samples from (the module compares it with its own to measure staleness)."""

    policy_version: int = 0

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        """``seed`` is one seed for the call, or one per row (rows sharing a seed are sampled together)."""
        raise NotImplementedError

    def sync_weights(self, module: nn.Module, step: int) -> None:
        """Receive the trained weights after optimizer step ``step`` (no-op when sharing them)."""

    def close(self) -> None:
        """Free the engine's resources."""


class HFGenerateEngine(RolloutEngine):
    """``transformers.generate`` on the policy itself (always on-policy, no weight copy).

    Sampling draws from a private RNG stream seeded by ``seed`` for each call, so the global
    torch RNG is untouched and a resumed run samples exactly what an uninterrupted one does.

    Args:
        policy: the Hugging Face causal LM being trained (LoRA/QLoRA wrappers included).
        eos_token_id / pad_token_id: the tokenizer's ids.
        return_logprobs: also report behaviour log-probs from generate's scores (costs an
            ``[N, C, V]`` buffer; off by default since this engine *is* the policy).
    """

    def __init__(self, policy: nn.Module, eos_token_id: int, pad_token_id: int, return_logprobs: bool = False):
        self.policy = policy
        self.policy_version = 0
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.return_logprobs = return_logprobs

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        if isinstance(seed, int):
            return self._generate(prompt_ids, sampling, seed)
        parts = [self._generate(prompt_ids[a:b], sampling, seed[a]) for a, b in runs_of_equal(seed)]
        logprobs = None if not self.return_logprobs else [lp for p in parts for lp in p.logprobs]
        return RolloutOutput([c for p in parts for c in p.completion_ids], logprobs)

    def sync_weights(self, module: nn.Module, step: int) -> None:
        self.policy_version = step  # samples from the live policy: never stale

    @torch.no_grad()
    def _generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> RolloutOutput:
        device = next(self.policy.parameters()).device
        ids, mask = left_pad(prompt_ids, self.pad_token_id, device)
        was_training = self.policy.training
        self.policy.eval()
        devices = [device] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                out = self.policy.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens,
                    eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
                    return_dict_in_generate=True, output_scores=self.return_logprobs,
                    synced_gpus=world_size() > 1 and is_sharded(self.policy), **_sampling_kwargs(sampling))
        finally:
            self.policy.train(was_training)
        new = out.sequences[:, ids.shape[1]:]
        completions = [cut_at_eos(row, self.eos_token_id) for row in new.tolist()]
        logprobs = None
        if self.return_logprobs:
            scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)
            picked = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1).tolist()
            logprobs = [row[: len(c)] for row, c in zip(picked, completions)]
        return RolloutOutput(completions, logprobs)


def _sampling_kwargs(sampling: SamplingConfig) -> dict:
    if sampling.temperature == 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k or None}


def runs_of_equal(values: list[int]) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of the maximal runs of equal consecutive values."""
    starts = [i for i in range(len(values)) if i == 0 or values[i] != values[i - 1]]
    return list(zip(starts, starts[1:] + [len(values)]))


def left_pad(rows: list[list[int]], pad_id: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def right_pad(rows: list[list[int]], pad_value: float | int, dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    width = width if width is not None else max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), pad_value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def cut_at_eos(tokens: list[int], eos_id: int) -> list[int]:
    """Tokens up to and including the first EOS (generate pads finished rows after it)."""
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens
