"""`fused_logprobs`: target log-probs and entropies straight from hidden states and the LM head.

Registered as the custom ops ``lightning_rlpt::fused_logprobs_fwd`` and ``..._bwd``, whose
implementation is picked per call by `choose` (forced by name, or measured once per shape
bucket: see `implementations`), fake implementations for ``torch.compile``, and an autograd
formula whose backward is the ``_bwd`` op. Neither direction ever holds the full
``[tokens, vocab]`` logits.
"""
from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
from torch import Tensor

from . import choose
from .chunked import compute_dtype
from .implementations import BACKWARD, FORWARD

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_values(hidden: Tensor, targets: Tensor, vocab: int, ignore_index: int) -> None:
    """Data-dependent checks, run inside the op before any matmul (one host sync for both)."""
    bad_ids = ((targets < 0) | (targets >= vocab)) & (targets != ignore_index)
    ids_bad, hidden_bad = torch.stack([bad_ids.any(), ~torch.isfinite(hidden).all()]).tolist()
    if ids_bad:
        raise ValueError(
            f"fused_logprobs: target id {targets[bad_ids][0].item()} is outside the vocabulary [0, {vocab}) and "
            f"is not ignore_index={ignore_index}. Targets must be token ids of this LM head; mark padding "
            f"with ignore_index (or pass ignore_index=<your padding value>).")
    if hidden_bad:
        raise ValueError(
            "fused_logprobs: hidden states contain NaN or Inf. The model's forward diverged upstream (check the "
            "learning rate, loss scale or fp16 overflow); log-probs computed from them would be meaningless.")


def _no_autocast(device: torch.device):
    """Autocast reaches inside custom ops: under ``precision="bf16-mixed"`` the entropy's row dot
    (``torch.bmm``) ran in bf16 (entropy off by 1.6e-2 instead of 1.4e-5). The kernels accumulate
    in fp32 whatever autocast the caller runs under."""
    usable = torch.amp.autocast_mode.is_autocast_available(device.type)
    return torch.autocast(device.type, enabled=False) if usable else contextlib.nullcontext()


def _forward(hidden, weight, bias, targets, temperature, ignore_index, with_entropy, impl=""):
    _check_values(hidden, targets, weight.shape[0], ignore_index)

    def run(name):
        return FORWARD[name](hidden, weight, bias, targets, temperature, ignore_index, with_entropy)

    with _no_autocast(hidden.device):
        logp, ent, lse = choose.dispatch("forward", impl, hidden, weight, bias, choose.forward_flags(with_entropy), run)
    return logp, (ent if ent is not None else logp.new_empty(0)), lse


@torch.library.custom_op("lightning_rlpt::fused_logprobs_fwd", mutates_args=())
def _fwd(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], targets: Tensor, temperature: float,
         ignore_index: int, with_entropy: bool, impl: str = "") -> tuple[Tensor, Tensor, Tensor]:
    """``(logp [N], entropy [N] or [0], lse [N])`` of 2-D hidden states ``[N, H]``; ``impl``: a name,
    ``"auto"`` or ``""`` (the environment variable, else the device's default; see `choose`)."""
    return _forward(hidden, weight, bias, targets, temperature, ignore_index, with_entropy, impl)


@_fwd.register_fake
def _fwd_fake(hidden, weight, bias, targets, temperature, ignore_index, with_entropy, impl=""):
    n, dt = hidden.shape[0], compute_dtype(hidden.dtype, weight.dtype)
    return (hidden.new_empty(n, dtype=dt), hidden.new_empty(n if with_entropy else 0, dtype=dt),
            hidden.new_empty(n, dtype=dt))


def _backward(grad_logp, grad_entropy, hidden, weight, bias, targets, lse, entropy, temperature, ignore_index,
              need_hidden, need_weight, impl=""):
    def run(name):
        return BACKWARD[name](grad_logp, grad_entropy, hidden, weight, bias, targets, lse, entropy, temperature,
                              ignore_index, need_hidden, need_weight)

    flags = choose.backward_flags(grad_entropy is not None, need_hidden, need_weight)
    with _no_autocast(hidden.device):
        d_h, d_w, d_b = choose.dispatch("backward", impl, hidden, weight, bias, flags, run)
    # Ops return tensors only: an empty tensor stands for "not computed".
    return tuple(g if g is not None else hidden.new_empty(0) for g in (d_h, d_w, d_b))


@torch.library.custom_op("lightning_rlpt::fused_logprobs_bwd", mutates_args=())
def _bwd(grad_logp: Optional[Tensor], grad_entropy: Optional[Tensor], hidden: Tensor, weight: Tensor,
         bias: Optional[Tensor], targets: Tensor, lse: Tensor, entropy: Tensor, temperature: float,
         ignore_index: int, need_hidden: bool, need_weight: bool, impl: str = "") -> tuple[Tensor, Tensor, Tensor]:
    """``(d hidden, d weight, d bias)``; each empty where not needed (or no bias)."""
    return _backward(grad_logp, grad_entropy, hidden, weight, bias, targets, lse, entropy, temperature,
                     ignore_index, need_hidden, need_weight, impl)


@_bwd.register_fake
def _bwd_fake(grad_logp, grad_entropy, hidden, weight, bias, targets, lse, entropy, temperature, ignore_index,
              need_hidden, need_weight, impl=""):
    d_h = torch.empty_like(hidden) if need_hidden else hidden.new_empty(0)
    d_w = torch.empty_like(weight) if need_weight else hidden.new_empty(0)
    d_b = torch.empty_like(bias) if need_weight and bias is not None else hidden.new_empty(0)
    return d_h, d_w, d_b


def _setup_context(ctx, inputs, output):
    hidden, weight, bias, targets, temperature, ignore_index, with_entropy, impl = inputs
    _, entropy, lse = output
    ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
    ctx.temperature, ctx.ignore_index, ctx.with_entropy, ctx.impl = temperature, ignore_index, with_entropy, impl
    # An output nobody differentiates (a detached entropy) reaches the backward as None, not as
    # zeros: its terms then cost no arithmetic at all.
    ctx.set_materialize_grads(False)


def _fwd_backward(ctx, grad_logp, grad_entropy, _grad_lse):
    hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
    need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    d_h, d_w, d_b = _bwd(grad_logp, grad_entropy if ctx.with_entropy else None, hidden, weight, bias, targets,
                         lse, entropy, ctx.temperature, ctx.ignore_index, need_hidden, need_weight, ctx.impl)
    return (d_h if need_hidden else None, d_w if ctx.needs_input_grad[1] else None,
            d_b if bias is not None and ctx.needs_input_grad[2] else None, None, None, None, None, None)


torch.library.register_autograd("lightning_rlpt::fused_logprobs_fwd", _fwd_backward, setup_context=_setup_context)


def _validate(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None, temperature: float) -> None:
    """Shape, dtype, device and temperature checks: static, so free under ``torch.compile``."""
    def fail(what: str, fix: str) -> None:
        raise ValueError(f"fused_logprobs: {what}. {fix}")

    if weight.dim() != 2 or weight.shape[0] == 0:
        fail(f"weight must be [V, H] with V >= 1, got shape {tuple(weight.shape)}",
             "Pass the LM head's weight (lm_head.weight).")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        fail(f"hidden {tuple(hidden.shape)} must end in H={weight.shape[1]} (weight is {tuple(weight.shape)})",
             "Pass the last hidden states [..., H] that feed this LM head.")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        fail(f"targets {tuple(targets.shape)} must have hidden's leading shape {tuple(hidden.shape[:-1])}",
             "Shift targets against hidden states yourself (hidden[:, :-1] predicts ids[:, 1:]).")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        fail(f"targets must be integer token ids, got {targets.dtype}", "Pass a torch.long tensor.")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        fail(f"bias {tuple(bias.shape)} must be [V]=({weight.shape[0]},)", "Pass lm_head.bias (or None).")
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in _FLOATS:
            fail(f"{name} has dtype {t.dtype}", "Use float16, bfloat16, float32 or float64.")
    for name, t in (("hidden", hidden), ("targets", targets), ("bias", bias)):
        if t is not None and t.device != weight.device:
            fail(f"{name} is on {t.device} but weight is on {weight.device}", "Move them to one device.")
    if isinstance(temperature, Tensor) or not isinstance(temperature, (int, float)) or \
            not math.isfinite(temperature) or temperature <= 0:
        fail(f"temperature must be a finite Python number > 0, got {temperature!r}",
             "Use the sampling temperature of the rollout (1.0 for plain softmax).")


def fused_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                   temperature: float = 1.0, ignore_index: int = -100, return_entropy: bool = True,
                   impl: str | None = None) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target and entropy of each softmax, without materialising the logits.

    With ``z = (hidden @ weight.T + bias) / temperature``: ``logprobs = log_softmax(z)[target]``
    and ``entropy = -(softmax(z) * log_softmax(z)).sum(-1)``. Differentiable in ``hidden``,
    ``weight`` and ``bias`` through both outputs; works under ``torch.compile``.

    Args:
        hidden: ``[..., H]`` last hidden states (any float dtype; bf16/fp16 accumulate in fp32).
        weight: ``[V, H]`` LM-head weight.
        targets: integer ids of shape ``hidden.shape[:-1]``.
        bias: optional ``[V]`` LM-head bias.
        temperature: the logits are divided by it (> 0).
        ignore_index: targets equal to it give log-prob 0, entropy 0 and no gradient.
        return_entropy: if False, the entropy is neither computed nor returned (None).
        impl: which implementation runs (`implementations` lists a device's names); ``"auto"``
            times them once per shape bucket and keeps the fastest. None: the environment
            variable ``LIGHTNING_RLPT_LOGPROB_IMPL``, else ``"auto"`` on CUDA, ``"chunked"`` elsewhere.

    Returns:
        ``(logprobs, entropy)`` of shape ``targets.shape``, float32 (float64 for float64
        inputs); ``entropy`` is None when ``return_entropy=False``.

    Raises:
        ValueError: mismatched shapes/devices/dtypes, temperature <= 0, target ids outside
            ``[0, V)`` other than ``ignore_index``, NaN/Inf hidden states, or an ``impl`` (or
            variable) naming no implementation usable on this device (the message lists them).

    Examples:
        >>> hidden, weight = torch.zeros(2, 3, 4), torch.zeros(8, 4)
        >>> logp, ent = fused_logprobs(hidden, weight, torch.tensor([[1, 2, -100], [0, 0, 7]]))
        >>> logp[0].tolist()  # uniform over 8 tokens: log(1/8); the ignored position gives 0
        [-2.079441547393799, -2.079441547393799, 0.0]
    """
    _validate(hidden, weight, targets, bias, temperature)
    if impl is not None:
        choose.check_impl(impl, weight.device, compute_dtype(hidden.dtype, weight.dtype))
    logp, entropy, _ = _fwd(hidden.reshape(-1, hidden.shape[-1]), weight, bias, targets.reshape(-1),
                            float(temperature), int(ignore_index), bool(return_entropy), impl or "")
    return logp.view(targets.shape), (entropy.view(targets.shape) if return_entropy else None)
