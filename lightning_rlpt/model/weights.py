"""Full, merged weights of the trained policy under Hugging Face checkpoint names.

A rollout engine (vLLM) holds its own copy of the policy. After an optimizer step it needs
the weights the learner trains with, named as in the model's ``model.safetensors``:

- **full fine-tune**: the policy's parameters as they are;
- **LoRA**: for every adapted layer the merged tensor ``W + scale · B A`` is *computed*
  (peft's ``get_delta_weight``) and streamed; the trained module is never touched. We do not
  merge → copy → unmerge: unmerging subtracts the delta again, which in bf16/fp16 does not
  give ``W`` back bit for bit (``(W + Δ) − Δ ≠ W``), it races with autograd state, and it
  would write into sharded (FSDP) parameters;
- **QLoRA**: the 4-bit base is dequantised with bitsandbytes (``dequantize_4bit``: NF4/FP4
  code × per-block absmax, itself dequantised when double quantisation is on) to the compute
  dtype, then the LoRA delta is added. The dequantised values are exactly those the 4-bit
  layer multiplies with in its own forward, so the only extra rounding is one add in the
  compute dtype (≈ 6e-8 relative in fp32); the engine then runs the merged dense weights.

peft names are mapped back: ``base_model.model.`` and ``.base_layer`` are stripped, adapter
tensors (``lora_A``, ``lora_B``, ...) are dropped, ``modules_to_save`` copies replace the
originals. Tensors sharded as DTensors (FSDP2) are gathered with ``full_tensor()`` (a
collective: every rank must iterate).

Examples:
    >>> names = [name for name, _ in policy_weights(module.policy)]  # doctest: +SKIP
    >>> names[:2]  # doctest: +SKIP
    ['model.embed_tokens.weight', 'model.layers.0.self_attn.q_proj.weight']
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

_ADAPTER_KEYS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


@torch.no_grad()
def policy_weights(policy: nn.Module, aliases: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` for every parameter of the policy, LoRA deltas merged in.

    Args:
        policy: a Hugging Face causal LM, optionally wrapped by peft (LoRA / QLoRA).
        aliases: a parameter shared by several modules (tied embeddings: ``lm_head.weight`` is
            ``model.embed_tokens.weight``) is yielded under each of its names. An engine needs
            every name: vLLM's in-place reload rebuilds each layer on its own, so a tied head
            that receives no tensor keeps the weights it was started with (``ParallelLMHead:
            Failed to load weights``) and samples from another policy. False: once, under its
            first name, as ``save_pretrained`` writes it (`model.export`).

    Yields tensors one at a time (merged ones are computed on the fly), so the peak extra
    memory is one layer, not a second model.
    """
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    layers = _lora_layers(base)
    for name, param in base.named_parameters(remove_duplicate=not aliases):
        if any(f".{key}." in f".{name}" for key in _ADAPTER_KEYS) or ".original_module." in name:
            continue
        hf_name = checkpoint_name(name)
        owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        tensor = dense(param)
        if owner in layers:
            tensor = merged(layers[owner], tensor, bias=name.endswith(".bias"))
        yield hf_name, tensor


def checkpoint_name(name: str) -> str:
    """The Hugging Face checkpoint name of a (possibly peft-wrapped) parameter name."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    name = name.replace(".base_layer.", ".")
    if ".modules_to_save." in name:  # ``lm_head.modules_to_save.default.weight`` → ``lm_head.weight``
        head, tail = name.split(".modules_to_save.", 1)
        name = f"{head}.{tail.split('.', 1)[1]}"
    return name


def dense(param: torch.Tensor) -> torch.Tensor:
    """A plain tensor: DTensors gathered, bitsandbytes 4-bit weights dequantised."""
    if hasattr(param, "full_tensor"):
        param = param.full_tensor()
    kind = type(param).__name__
    if kind == "Params4bit":
        import bitsandbytes.functional as bnbf

        check_not_repacked(param)
        return bnbf.dequantize_4bit(param.data, param.quant_state)
    if kind == "Int8Params":
        raise NotImplementedError("8-bit (LLM.int8) base weights cannot be synced to vLLM; use 4-bit QLoRA "
                                  "(quantization='nf4') or an unquantised base")
    return param.detach()


def check_not_repacked(param: torch.Tensor) -> None:
    """bitsandbytes repacks a 4-bit weight, in place and for good, the first time its layer runs
    in eval mode without grad on a CPU with AVX512-BF16 (its bf16 inference kernel); that
    layout cannot be dequantised back exactly, so syncing it would send wrong weights."""
    if getattr(getattr(param, "quant_state", None), "packing_format_for_cpu", False):
        raise RuntimeError(
            "a 4-bit base weight was repacked by bitsandbytes' CPU inference path (an eval-mode, no-grad "
            "forward such as transformers.generate or a validate() run on the HF engine), and the repacked "
            "layout cannot be dequantised exactly for vLLM. Start VLLMRollout before any such forward "
            "(use VLLMRollout(validate=True) for validate() runs) or reload the QLoRA model")


def merged(layer: nn.Module, base: torch.Tensor, bias: bool = False) -> torch.Tensor:
    """``base`` plus the active adapters' deltas of ``layer`` (a peft ``LoraLayer``)."""
    if getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False):
        return base  # already merged into the base weight, or adapters switched off
    out = base.clone()
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A and adapter not in getattr(layer, "lora_embedding_A", {}):
            continue
        if getattr(layer, "use_dora", {}).get(adapter, False):
            raise NotImplementedError("DoRA adapters cannot be synced to vLLM yet (the merge needs the "
                                      "magnitude vector); use plain LoRA (use_dora=False)")
        if bias:
            if getattr(layer, "lora_bias", {}).get(adapter, False):
                out += layer.lora_B[adapter].bias.to(out.dtype) * layer.scaling[adapter]
            continue
        out += layer.get_delta_weight(adapter).to(out.dtype)
    return out


def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def grad_norm(params: list[torch.Tensor]) -> float:
    """The total 2-norm of the parameters' gradients (FSDP2's sharded ones gathered)."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
