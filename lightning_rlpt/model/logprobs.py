"""Per-token log-probs (and entropies) of completions under a causal LM.

The decoder runs once; the LM head then scores only the completion positions. With a plain
``nn.Linear`` head (tied embeddings included) the fused kernel
(`lightning_rlpt.kernels.fused_logprobs`) computes log-probs and entropy tile by tile without
an ``[N, C, V]`` logits buffer. A peft LoRA on ``lm_head`` takes the fused path too, through its
effective weight ``W + Σ s·B·A`` (one ``[V, H]`` temporary, the size of the head, whose gradient
flows back to ``A`` and ``B``) when no LoRA dropout is active; any other head (DoRA, soft-capped
logits, dropout in training mode) takes the plain path. An FSDP2-sharded model runs
its root forward instead (``logits_to_keep`` trims the logits to the completion), so FSDP's
hooks gather every parameter, the LM head included; the fused kernel is not used there.
"""
from __future__ import annotations

import torch
from torch import nn

from .distributed import is_sharded


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` computes them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    use_fused_kernel: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[N, C]`` of the last ``completion_len`` tokens, and (detached) entropies.

    Logits are divided by ``temperature`` so that they describe the distribution the rollout
    sampled from.
    """
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_for(attention_mask),
                  use_cache=False)
    targets = input_ids[:, -completion_len:]
    if is_sharded(model):
        logits = model(**inputs, logits_to_keep=completion_len + 1).logits[:, :-1]
        return logits_logprobs(logits, targets, temperature, with_entropy)
    hidden = model.get_decoder()(**inputs).last_hidden_state[:, -completion_len - 1 : -1]
    head = model.get_output_embeddings()
    linear = head_as_linear(head) if use_fused_kernel and _fused() is not None else None
    if linear is not None:
        weight, bias = linear
        logp, ent = _fused()(hidden, weight, targets, bias=bias, temperature=temperature, return_entropy=with_entropy)
        return logp, (ent.detach() if ent is not None else None)
    return logits_logprobs(head(hidden), targets, temperature, with_entropy)


def head_as_linear(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(weight [V, H], bias)`` such that ``head(x) == x @ weight.T + bias``, or None.

    A plain ``nn.Linear`` gives its own parameters. A peft LoRA ``Linear`` gives
    ``W + Σ_a scaling_a · B_a A_a`` over its active adapters (differentiable in ``A`` and ``B``),
    provided it is just that: no DoRA or other LoRA variant, no LoRA bias, no active dropout.
    """
    if type(head) is nn.Linear:
        return head.weight, head.bias
    base = getattr(head, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(head, "lora_A"):
        return None
    if getattr(head, "merged", False):  # base.weight holds the adapters; peft unmerges to disable them
        return None if getattr(head, "disable_adapters", False) else (base.weight, base.bias)
    if getattr(head, "disable_adapters", False):
        return base.weight, base.bias
    weight = base.weight
    for name in head.active_adapters:
        if name not in head.lora_A:
            continue
        dropout = head.lora_dropout[name]
        variant = name in getattr(head, "lora_variant", {}) or getattr(head, "use_dora", {}).get(name, False)
        if variant or getattr(head, "lora_bias", {}).get(name, False) or (
                head.training and not isinstance(dropout, nn.Identity) and getattr(dropout, "p", 1.0) > 0):
            return None
        a, b = head.lora_A[name].weight, head.lora_B[name].weight
        weight = weight + head.scaling[name] * (b @ a).to(weight.dtype)
    return weight, base.bias


def logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain path: full ``[N, C, V]`` logits, log-softmax, gather."""
    logp_all = (logits.float() / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _fused():
    try:
        from lightning_rlpt.kernels import fused_logprobs
    except ImportError:
        return None
    return fused_logprobs
