"""How long a context an engine needs for a module's rollouts (`context_length`), and the config
of the policy under its LoRA/QLoRA wrappers (`model_config`): for any engine that sizes its own
context (vLLM's ``max_model_len``, a server's), so prompts and completions always fit."""
from __future__ import annotations

from typing import Any

from torch import nn


def model_config(policy: nn.Module) -> Any:
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    return base.config



def context_length(module: Any, max_model_len: int | None, max_tokens: int | None, config: Any,
                   minimum: bool = False) -> int:
    """An engine's context (vLLM's ``max_model_len``): the longest prompt plus the longest completion, checked.

    Multi-turn episodes (``RLModule(tools=..., environment=..., rollout_func=...)``) need more:
    an episode's context is the prompt, every model turn *and* every tool/environment message,
    and ``max_new_tokens`` counts model tokens only (docs/agents.md). So with an active agent
    and no ``max_model_len`` the engine gets the model's whole context
    (``max_position_embeddings``), the bound the HF engine has too (both then truncate an
    episode at the same point, flagged); a given ``max_model_len`` must still hold the longest
    prompt and completion, and episodes longer than it are truncated and flagged.

    Args:
        module: the `RLModule` (its sampling settings and agent).
        max_model_len: the caller's value, or None to size it.
        max_tokens: a training override of ``max_new_tokens`` (an engine's ``overrides``, e.g. ``VLLMRollout(max_tokens=...)``).
        config: the policy's config.
        minimum: the least an engine started elsewhere must hold (prompt + completion; a
            one-token prompt without ``max_prompt_length``, longer ones are refused batch by
            batch, `prompt_checks`), not the size to start one with.

    Examples:
        >>> context_length(module, None, None, module.policy.config)  # doctest: +SKIP
        72
    """
    prompt = module.sampling.max_prompt_length
    completion = max(module.sampling.max_new_tokens, module.val_sampling.max_new_tokens, max_tokens or 0)
    positions = getattr(config, "max_position_embeddings", None)
    episodes = not minimum and max_model_len is None and getattr(module, "episodes", False)
    if prompt is None and minimum:  # no prompt limit: each batch is checked against the engine's context
        return completion + 1
    if prompt is None or (episodes and positions is not None):
        if max_model_len is None and positions is None:
            raise ValueError("set max_model_len (or the generation's max_prompt_length): the model config has no "
                             "max_position_embeddings to size vLLM's context from")
        if prompt is not None and positions < prompt + completion:
            raise ValueError(f"the model's context (max_position_embeddings={positions}) is shorter than "
                             f"max_prompt_length {prompt} + max_new_tokens {completion}; lower max_prompt_length or "
                             "max_new_tokens")
        return int(max_model_len or positions)
    needed = prompt + completion
    if max_model_len is not None and max_model_len < needed:
        raise ValueError(f"max_model_len={max_model_len} is shorter than max_prompt_length ({prompt}) + max_new_tokens "
                         f"({completion}) = {needed}: vLLM could not hold the longest prompt and completion. Set "
                         f"max_model_len >= {needed} (or None to size it automatically), or lower max_prompt_length / "
                         "max_new_tokens in the module's generation settings")
    length = max_model_len or needed
    if positions is not None and length > positions:
        raise ValueError(f"the model's context (max_position_embeddings={positions}) is shorter than the {length} "
                         f"tokens asked for (max_prompt_length {prompt} + max_new_tokens {completion}); lower "
                         "max_prompt_length or max_new_tokens")
    return int(length)
