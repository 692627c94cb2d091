"""Rollout engines: turn prompt token ids into sampled completions.

`RolloutEngine` is the interface every engine implements: the default `HFGenerateEngine`
(``rollout/hf.py``) and vLLM's (``rollout/vllm/``, installed by the ``VLLMRollout`` callback).
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Callable, Iterable

import torch

from .sampling import SamplingConfig

# What an engine receives after an optimizer step: a zero-argument callable that yields the
# policy's full weights as (checkpoint name, tensor) pairs. Lazy, so an engine that shares the
# policy (or skips this step) never pays for a gather or a LoRA merge.
WeightSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]


@dataclass
class RolloutOutput:
    """One completion per prompt row, without padding.

    ``completion_ids[i]`` ends with EOS when the model stopped by itself. ``logprobs[i]`` (when
    the engine reports them) holds the sampling log-prob of each token of ``completion_ids[i]``.
    Multi-turn episodes (``rollout/episodes``) also set ``model_mask[i]`` (1 on tokens the model
    sampled, 0 on tool/environment tokens) and ``truncated[i]`` (a budget ended the episode);
    engines leave both None: every token is the model's, and a row without a final EOS is truncated.
    """

    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None = None
    model_mask: list[list[int]] | None = None
    truncated: list[bool] | None = None


class RolloutEngine:
    """What the module needs from an engine. ``policy_version`` is the optimizer step whose
    weights the engine samples from (the module compares it with its own to measure staleness)."""

    policy_version: int = 0

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        """``seed`` is one seed for the call, or one per row; every engine turns it into one seed per
        row (`row_sampling.request_seeds`) and samples each row from its own seed alone."""
        raise NotImplementedError

    def sync_weights(self, weights: WeightSource, version: int, force: bool = False) -> None:
        """Receive the policy's weights after optimizer step ``version``: call ``weights()`` for
        the (name, tensor) pairs, or not at all (an engine sharing the policy, a step its
        schedule skips unless ``force``: the policy moved outside an optimizer step)."""

    def close(self) -> None:
        """Free the engine's resources."""


def runs_of_equal(values: list[int]) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of the maximal runs of equal consecutive values."""
    starts = [i for i in range(len(values)) if i == 0 or values[i] != values[i - 1]]
    return list(zip(starts, starts[1:] + [len(values)]))


def cut_at_eos(tokens: list[int], eos_id: int) -> list[int]:
    """Tokens up to and including the first EOS (generate pads finished rows after it)."""
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens
