"""Rollout engines: turn prompt token ids into sampled completions.

`RolloutEngine` is the contract every engine implements: the default `HFGenerateEngine`
(``rollout/hf.py``), vLLM's (``rollout/vllm/``, installed by the ``VLLMRollout`` callbacks) and
any other (docs/architecture.md, "Adding a rollout engine").
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

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


class RolloutEngine(ABC):
    """The engine contract: everything the module and the callbacks read from an engine.

    Subclass it and implement `generate` and `sync_weights` (both abstract: an engine without a
    `sync_weights` would sample from stale weights without a word, so one that truly needs no
    copy says so in its own, e.g. `HFGenerateEngine`, which samples from the policy itself and
    only records the version). The attributes below have defaults here; an engine that does not
    subclass must define each of them. `RLModule` checks the installed engine against
    `ENGINE_ATTRIBUTES` when fitting starts (`rollout.contract.check_engine`) and refuses one
    that lacks any, naming what is missing.

    Attributes:
        policy_version: the optimizer step whose weights the latest `generate` sampled with
            (it becomes ``Experience.policy_version``). `sync_weights` sets it when it copies.
        held_version: the step whose weights the engine holds now; ``policy_version`` except for
            an engine that hands out rollouts made earlier (`rollout.pipeline.RolloutPipeline`).
            The module checks it before every training rollout: ``policy_version`` of the module
            minus this must lie in ``[0, sync_every)``, else a sync was skipped or failed.
        phase: ``"training"`` or ``"validation"``, set by the installing callback
            (`lightning_rlpt.callbacks.EngineCallback`); training overrides apply to the first only.
        where: the trainer step, for the engine's error messages (set by the same callback).
        max_model_len: the longest prompt + completion the engine holds, or None (the model's
            positions bound it); prompts that do not fit are refused before a rollout.
        return_logprobs: `generate` reports the sampled tokens' log-probs.
        overrides: training-rollout settings replacing the module's `SamplingConfig`
            (``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``stop``); empty: none.
        sync_every: optimizer steps between weight copies; 1 is on-policy.
        max_staleness: rollouts the engine generates ahead of training (0: each batch is sampled
            when it trains; `RolloutPipeline` sets k).
        last_sync: ``{"bytes": ..., "seconds": ...}`` of the latest copy (empty: none measured).
        can_run_ahead: `generate` may run on another worker while the trainer updates the policy
            (the engine samples from its own copy of the weights), so ``max_staleness`` can wrap it.
    """

    policy_version: int = 0
    phase: str = "training"
    where: str = "start-up"
    max_model_len: int | None = None
    return_logprobs: bool = False
    overrides: Mapping[str, Any] = MappingProxyType({})
    sync_every: int = 1
    max_staleness: int = 0
    last_sync: Mapping[str, float] = MappingProxyType({})
    can_run_ahead: bool = False

    @property
    def held_version(self) -> int:
        return self.policy_version

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        """``seed`` is one seed for the call, or one per row; every engine turns it into one seed per
        row (`per_row.request_seeds`) and samples each row from its own seed alone."""

    @abstractmethod
    def sync_weights(self, weights: WeightSource, version: int, force: bool = False) -> None:
        """Receive the policy's weights after optimizer step ``version``: call ``weights()`` for
        the (name, tensor) pairs and set ``policy_version = version`` when copying; skip the copy
        on a step the engine's schedule skips (``sync_every``) unless ``force`` (the policy moved
        outside an optimizer step). An engine sharing the policy records the version only."""

    def close(self) -> None:
        """Free the engine's resources."""


# What the module and the callbacks read from an engine (`rollout.contract.check_engine`).
ENGINE_ATTRIBUTES = ("policy_version", "held_version", "phase", "where", "max_model_len", "return_logprobs",
                     "overrides", "sync_every", "max_staleness", "last_sync", "can_run_ahead")
ENGINE_METHODS = ("generate", "sync_weights", "close")


def runs_of_equal(values: list[int]) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of the maximal runs of equal consecutive values."""
    starts = [i for i in range(len(values)) if i == 0 or values[i] != values[i - 1]]
    return list(zip(starts, starts[1:] + [len(values)]))


def cut_at_eos(tokens: list[int], eos_id: int) -> list[int]:
    """Tokens up to and including the first EOS (generate pads finished rows after it)."""
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens
