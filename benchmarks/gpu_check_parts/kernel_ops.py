"""The log-prob candidates the kernel parts compare, and their inputs.

* ``plain``: the module's path on full logits. For the training-shaped step it is
  `lightning_rlpt.model.logprobs.logits_logprobs` on ``F.linear(hidden, weight)`` (entropy under
  ``no_grad``); for the accuracy check, where gradients also flow through the entropy,
  `logprob_kernel.naive_full` (the same logits and fp32 log-softmax, entropy differentiable).
* ``fused:<name>``: ``lightning_rlpt.kernels.fused_logprobs(..., impl=name)`` for every name
  ``lightning_rlpt.kernels.implementations(device)`` lists, and ``fused:auto`` (no ``impl``: the
  op's own choice); where the op lists no implementations, its single path as ``fused:default``.
* ``liger``: Liger-Kernel's fused linear cross-entropy, ``reduction="none"`` (its per-token loss is
  minus the log-prob; no entropy). A benchmark peer only: the package never imports it.
"""
from __future__ import annotations

from typing import Callable

import torch

from .common import Skipped, require

# Real LM heads give peaked softmaxes: weights scaled so the logits' standard deviation is 4
# (a unit-variance head would make every softmax nearly uniform over 150k tokens).
LOGIT_STD = 4.0
LIGER_INSTALL = "pip install liger-kernel; `make gpu-wheels` carries it to the GPU machine"

Candidate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def fused_names(device: str) -> tuple[str, ...]:
    """The fused implementations usable on ``device``, then ``auto`` (the op's own choice, what
    the module runs); ``("default",)`` where the op lists no implementations."""
    from lightning_rlpt import kernels
    lister = getattr(kernels, "implementations", None)
    return tuple(lister(device)) + ("auto",) if lister is not None else ("default",)


def chosen(hidden: torch.Tensor, weight: torch.Tensor) -> str | None:
    """The op's automatic choices for a training step on these inputs (forward; backward with a
    detached entropy), where the op reports them (``chosen_implementation``), else None."""
    from lightning_rlpt import kernels
    reader = getattr(kernels, "chosen_implementation", None)
    if reader is None:
        return None
    try:
        forward = reader(hidden, weight)
        backward = reader(hidden, weight, backward=True, with_entropy=False) or \
            reader(hidden, weight, backward=True, with_entropy=True)
    except TypeError:  # another signature: not worth failing the part over
        return None
    return None if forward is None and backward is None else f"forward {forward}, backward {backward}"


def fused(name: str, detach_entropy: bool) -> Candidate:
    """``fused_logprobs`` with implementation ``name`` (``auto`` / ``default``: no ``impl`` argument)."""
    from lightning_rlpt.kernels import fused_logprobs
    kwargs = {} if name in ("auto", "default") else {"impl": name}

    def call(hidden, weight, targets):
        logp, ent = fused_logprobs(hidden, weight, targets, return_entropy=True, **kwargs)
        return logp, (ent.detach() if detach_entropy else ent)
    return call


def plain(train: bool) -> Candidate:
    """The module's plain path (``train``: entropy detached) or the differentiable naive one."""
    from logprob_kernel import naive_full, naive_train  # benchmarks/logprob_kernel.py
    return naive_train if train else naive_full


def liger(device: str) -> Candidate:
    """Liger's fused linear cross-entropy as ``(log-probs, None)``; `Skipped` where it cannot run."""
    require("liger_kernel", LIGER_INSTALL)
    if device != "cuda":
        raise Skipped("liger-kernel needs CUDA (its Triton kernels do not run on CPU tensors)")
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    def call(hidden, weight, targets):
        loss = liger_fused_linear_cross_entropy(hidden, weight, targets, reduction="none",
                                                accum_dtype=torch.float32)
        return -loss.float(), None
    return call


def candidates(device: str, train: bool) -> dict[str, Candidate | Skipped]:
    """Every candidate by name; a `Skipped` in place of one that cannot run here."""
    out: dict[str, Candidate | Skipped] = {"plain": plain(train)}
    for name in fused_names(device):
        out[f"fused:{name}"] = fused(name, detach_entropy=train)
    try:
        out["liger"] = liger(device)
    except Skipped as why:
        out["liger"] = why
    return out


def make_inputs(n: int, h: int, v: int, dtype: torch.dtype, device: str, seed: int = 0):
    """``hidden [n, h]``, ``weight [v, h]`` (both requiring grad), ``targets [n]`` and per-token
    upstream weights ``coef [n]`` (standing in for advantages / lengths), drawn on ``device``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(n, h, device=device, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, device=device, generator=gen) * (LOGIT_STD / h ** 0.5)).to(dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), device=device, generator=gen)
    coef = torch.randn(n, device=device, generator=gen) / n
    return hidden, weight, targets, coef


def training_step(fn: Candidate, hidden, weight, targets, coef) -> None:
    """The RL step's shape: gradients through the log-probs only; the entropy a detached metric."""
    hidden.grad = weight.grad = None
    logp, ent = fn(hidden, weight, targets)
    (logp * coef).sum().backward()
    if ent is not None:
        assert not ent.requires_grad, "the training-shaped step must detach the entropy"

