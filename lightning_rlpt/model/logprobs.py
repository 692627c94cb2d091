"""Per-token log-probs (and entropies) of completions under a causal LM.

The decoder runs once; the LM head then scores only the completion positions. With a plain
``nn.Linear`` head (tied embeddings included) the fused kernel
(`lightning_rlpt.kernels.fused_logprobs`) computes log-probs and entropy tile by tile without
an ``[N, C, V]`` logits buffer. A peft LoRA on ``lm_head`` takes the fused path too, through its
effective weight ``W + Σ s·B·A`` (one ``[V, H]`` temporary, the size of the head, whose gradient
flows back to ``A`` and ``B``) when no LoRA dropout is active; any other head (DoRA, dropout in
training mode) takes the plain path, as do soft-capped logits (Gemma 2's
``final_logit_softcapping``, applied as the model's forward does). `check_head` refuses, at
construction, a model whose forward transforms its logits in any other way. An FSDP2-sharded model runs the same
decoder-then-head code as a forward method of its root unit (`run_as_root_forward`), so the
fused kernel is used there too, on the gathered head weight.
"""
from __future__ import annotations

import torch
from torch import nn

from .distributed import is_dtensor, is_sharded, run_as_root_forward


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
    padding_free: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[N, C]`` of the last ``completion_len`` tokens, and entropies (detached unless
    ``entropy_grad``: an entropy bonus in the loss).

    Logits are divided by ``temperature`` so that they describe the distribution the rollout
    sampled from. ``padding_free`` runs the decoder on one packed row (`pack`); positions past a
    completion's end then hold its last real token's prediction, as padding does otherwise
    (masked out of every loss).
    """
    targets = input_ids[:, -completion_len:]

    def score() -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = completion_hidden(model, input_ids, attention_mask, completion_len, padding_free)
        return head_logprobs(model.get_output_embeddings(), hidden, targets, temperature, with_entropy,
                             use_fused_kernel, entropy_grad, softcap=logit_softcap(model))

    # Under FSDP2 the root unit's parameters (embeddings, final norm, LM head) are gathered by its
    # forward hooks only: `score` runs between them, so the head weight it reads is the gathered one.
    return run_as_root_forward(model, score) if is_sharded(model) else score()


def completion_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int,
                      padding_free: bool = False) -> torch.Tensor:
    """The decoder's last hidden states ``[N, C, H]`` at the positions that predict the last
    ``completion_len`` tokens (one packed row under ``padding_free``: `pack`)."""
    if padding_free:
        inputs, keep = pack(input_ids, attention_mask, completion_len)
    else:
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids_for(attention_mask), use_cache=False)
        keep = None
    hidden = model.get_decoder()(**inputs).last_hidden_state
    return hidden[:, -completion_len - 1 : -1] if keep is None else hidden[0, keep]


def linear_head(model: nn.Module, use_fused_kernel: bool = True) -> tuple[torch.Tensor, torch.Tensor | None] | str:
    """The policy's head as ``(weight, bias)`` for a kernel of our own, or why it cannot be
    (a soft-cap, a sharded model or head, a head that is no linear map, the kernel turned off)."""
    if not use_fused_kernel or _fused() is None:
        return "the fused kernel is off (use_fused_kernel=False)"
    if logit_softcap(model):
        return "the model soft-caps its logits"
    if is_sharded(model) or _sharded_head(model.get_output_embeddings()):
        return "the model is sharded (FSDP2)"
    linear = head_as_linear(model.get_output_embeddings())
    return "the head is not a plain linear map (DoRA, LoRA dropout, ...)" if linear is None else linear


def head_logprobs(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                  with_entropy: bool, use_fused_kernel: bool = True,
                  entropy_grad: bool = False, softcap: float | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``targets`` from the last hidden states ``[..., H]``:
    the fused kernel when the head is a plain linear map (`head_as_linear`), else full logits.

    Args:
        head: the LM head (``model.get_output_embeddings()``).
        hidden: hidden states at the positions that predict ``targets``.
        targets: token ids, ``hidden.shape[:-1]``.
        temperature: logits are divided by it.
        with_entropy: also return the entropies (detached unless ``entropy_grad``).
        use_fused_kernel: False forces full logits.
        entropy_grad: the entropies carry gradient (the fused kernel's own entropy backward).
        softcap: the model's final logit soft-cap ``c`` (logits ``c · tanh(z / c)``; `logit_softcap`),
            applied before the temperature on the plain path.
    """
    if softcap:
        logits = softcap * torch.tanh(head(hidden).float() / softcap)
        return logits_logprobs(logits, targets, temperature, with_entropy, entropy_grad)
    fused = _fused() if use_fused_kernel else None
    # A head still sharded here (its own fully_shard unit, outside the root's) gathers only in its
    # own forward: give it full logits rather than the fused op a DTensor.
    linear = head_as_linear(head) if fused is not None and not _sharded_head(head) else None
    if linear is None:
        return logits_logprobs(head(hidden), targets, temperature, with_entropy, entropy_grad)
    weight, bias = linear
    logp, ent = fused(hidden, weight, targets, bias=bias, temperature=temperature, return_entropy=with_entropy)
    return logp, (ent.detach() if ent is not None and not entropy_grad else ent)


def logit_softcap(model: nn.Module) -> float | None:
    """The final logit soft-cap the model's forward applies after its head (Gemma 2), or None."""
    config = getattr(model, "config", None)
    return getattr(config, "final_logit_softcapping", None) or getattr(
        getattr(config, "text_config", None), "final_logit_softcapping", None)


@torch.no_grad()
def check_head(model: nn.Module, atol: float = 1e-3) -> None:
    """Refuse a model whose forward does more to its logits than the head (and a soft-cap) we
    apply: the loss would score tokens under another distribution than the one sampled, silently.
    One forward of 3 tokens through both paths at construction."""
    if not hasattr(model, "get_decoder") or not hasattr(model, "get_output_embeddings"):
        return
    ids = torch.tensor([[1, 2, 3]], device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        expected = model(input_ids=ids, use_cache=False).logits[0, -1].float().log_softmax(-1)
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[:, -1:]
        ours, _ = head_logprobs(model.get_output_embeddings(), hidden, expected.argmax()[None, None], 1.0, False,
                                use_fused_kernel=False, softcap=logit_softcap(model))
    finally:
        model.train(was_training)
    gap = (ours[0, 0] - expected.max()).abs().item()
    if gap > atol:
        raise ValueError(f"{type(model).__name__}'s forward transforms its logits after the LM head in a way "
                         f"lightning-rlpt does not reproduce (log-prob gap {gap:.3g} on a probe; e.g. a logit scale "
                         "or a cap other than final_logit_softcapping): the loss would score completions under "
                         "another distribution than the one sampled. This architecture is not supported yet")


def _sharded_head(head: nn.Module) -> bool:
    return any(is_dtensor(p) for p in head.parameters())


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int
         ) -> tuple[dict[str, torch.Tensor | bool], torch.Tensor]:
    """Padding-free inputs: every row's real tokens in one ``[1, T]`` row, ``position_ids``
    restarting at 0 for each sequence, no attention mask and no KV cache, so that transformers'
    masking finds the sequence boundaries from the positions and no token attends across them
    (see docs/memory.md). Returns the inputs and ``keep [N, C]``: for each completion position,
    the index in the packed row of the token that predicts it. Each row's real tokens must be
    contiguous (left-padded prompt, right-padded completion), as in an `Experience`.

    Examples:
        >>> inputs, keep = pack(torch.tensor([[0, 5, 6, 7], [8, 9, 4, 0]]),
        ...                     torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]]), completion_len=2)
        >>> inputs["input_ids"].tolist(), inputs["position_ids"].tolist(), keep.tolist()
        ([[5, 6, 7, 8, 9, 4]], [[0, 1, 2, 0, 1, 2]], [[0, 1], [4, 5]])
    """
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    offsets = lengths.cumsum(0) - lengths
    # Index in the packed row of each padded position; right padding maps to the row's last real
    # token (left padding never predicts a completion token: a prompt has at least one token).
    packed_index = offsets[:, None] + mask.long().cumsum(1) - 1
    width = input_ids.shape[1]
    keep = packed_index[:, width - completion_len - 1: width - 1]
    inputs = dict(input_ids=input_ids[mask][None], position_ids=position_ids_for(attention_mask)[mask][None],
                  use_cache=False)
    return inputs, keep


# Attention implementations that read packed boundaries from position_ids (transformers' masking
# for sdpa/eager, cu_seqlens for flash-attention); flex_attention has no backward on CPU.
PACKING_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")


def check_padding_free(model: nn.Module) -> None:
    """Refuse ``padding_free`` for an attention implementation that would let packed sequences
    attend to each other or cannot train on them."""
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attn not in PACKING_ATTENTION:
        raise ValueError(f"padding_free=True needs an attention implementation that keeps packed sequences apart "
                         f"({', '.join(PACKING_ATTENTION)}); the policy uses {attn!r}. Load it with "
                         "attn_implementation='sdpa' (or flash_attention_2 on a GPU), or set padding_free=False")


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
                    with_entropy: bool, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain path: full ``[N, C, V]`` logits, log-softmax, gather (the entropy's graph only
    with ``entropy_grad``: it keeps another ``[N, C, V]`` tensor)."""
    logp_all = (logits.float() / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.enable_grad() if entropy_grad else torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _fused():
    try:
        from lightning_rlpt.kernels import fused_logprobs
    except ImportError:
        return None
    return fused_logprobs
