"""The LM head's gradient formed in the forward pass: three GEMMs per token instead of four.

`fused_logprobs` keeps the loss pure but must recompute every logits tile in its backward,
because the loss's gradient with respect to each log-prob is known only after the whole loss
is. When the loss is a sum of per-chunk terms that each see only their own rows (every
aggregation mode is: see `lightning_rlpt.stages.update`), that gradient is known as soon as a
chunk's log-probs are. `head_loss_in_forward` walks the rows in chunks and, per chunk:

1. computes the chunk's full-vocabulary logits once (GEMM 1) and from them its log-probs,
   entropies and softmax (kept as ``exp(z - max)`` and its row sums: one ``exp`` per logit);
2. asks ``chunk_loss`` (the objective, on two small leaf tensors ``[rows, C]``) for its share
   of the loss, and takes that share's gradient with respect to the log-probs and entropies by
   autograd: no objective writes its gradient by hand;
3. turns it into the logits' gradient in place, ``dz = g * onehot + p * (A + B * log p)``
   (`kernels.chunked.row_coefficients`), and forms ``d hidden = dz @ W / T`` (GEMM 2) and
   ``d W += dz.T @ (h / T)`` (GEMM 3) while the logits are still in memory.

The returned loss carries those gradients through `_Injected`, so ``loss.backward()`` sends
them into the decoder and the head's weight (a LoRA head's effective weight passes them on to
its adapters). A chunk's ``[rows × C, V]`` logits are the one large buffer; ``BUDGET_BYTES``
bounds the rows per chunk, and the caller falls back to `fused_logprobs` when a single row is over it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from .chunked import compute_dtype, row_coefficients

# One [rows × C, V] buffer per chunk, 32 MiB by default: the recompute path's two tiles take as
# much (kernels/chunked.py), so the step's peak memory does not grow. Elementwise passes run on
# SUB_ROWS rows of it at a time, so their temporaries stay small. Read at call time (tests patch it).
BUDGET_BYTES = 32 * 2**20
SUB_ROWS = 32


def rows_per_chunk(completion_len: int, vocab: int, budget_bytes: int | None = None, itemsize: int = 4) -> int:
    """Rows whose ``[rows × C, V]`` logits (``itemsize`` bytes each: 4 for float32, 8 for float64)
    fit ``budget_bytes``; 0 when one row's do not.

    Examples:
        >>> rows_per_chunk(32, 32000), rows_per_chunk(55, 151936), rows_per_chunk(56, 151936)
        (8, 1, 0)
    """
    per_row = completion_len * vocab * itemsize
    return int((budget_bytes or BUDGET_BYTES) // max(per_row, 1))


class _Injected(torch.autograd.Function):
    """A loss value whose gradients with respect to (hidden, weight, bias) were computed already."""

    @staticmethod
    def forward(ctx, value: Tensor, hidden: Tensor, weight: Tensor, bias: Tensor | None,
                grads: tuple[Tensor | None, Tensor | None, Tensor | None]) -> Tensor:
        ctx.grads = grads  # a tuple, not inputs: autograd keeps no graph of them
        return value.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable  # the gradients are numbers: a double backward must fail, not drop terms
    def backward(ctx, grad: Tensor):
        grads, ctx.grads = ctx.grads, None  # freed with the backward, not when the loss is dropped
        if grads is None:
            raise RuntimeError("a second backward through a loss whose head gradient was formed in the forward pass "
                               "(its gradients were handed out by the first): compute the loss again, or use "
                               "RLModule(head_gradient='recompute')")
        scaled = [None if d is None else d.mul_(grad.to(d.dtype)) for d in grads]
        return (None, *scaled, None)


def _blocks(t: int):
    return (slice(i, min(i + SUB_ROWS, t)) for i in range(0, t, SUB_ROWS))


def _chunk_softmax(u: Tensor, w: Tensor, b: Tensor | None, targets: Tensor, out: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(e [t, V] in out, s [t], log-prob of targets [t], entropy [t])`` of the logits ``u @ w.T + b``,
    with ``e = exp(z - max)`` and ``s = Σ e``, so ``p = e / s``: the logits' gradient then needs one
    multiply per element, not a second ``exp``. No other ``[t, V]`` tensor: the sums are taken
    SUB_ROWS rows at a time, through one block-sized buffer."""
    z = torch.mm(u, w.T, out=out) if b is None else torch.addmm(b, u, w.T, out=out)
    m = z.amax(1)
    sums, log_s, entropy = torch.empty_like(m), torch.empty_like(m), torch.empty_like(m)
    picked = z.gather(1, targets.unsqueeze(1)).squeeze(1).sub_(m)
    e = torch.empty_like(z[:SUB_ROWS])
    for blk in _blocks(z.shape[0]):  # one exp pass for both: s = Σ e^(z-m), a = Σ e^(z-m)·(z-m)
        shifted = z[blk].sub_(m[blk, None])
        eb = torch.exp(shifted, out=e[:shifted.shape[0]])
        s = eb.sum(1)
        a = torch.bmm(eb.unsqueeze(1), shifted.unsqueeze(2)).view(-1)
        sums[blk], log_s[blk] = s, s.log()
        entropy[blk] = log_s[blk] - a / s
        shifted.copy_(eb)
    return z, sums, picked.sub_(log_s), entropy


def _logits_grad_(e: Tensor, s: Tensor, coef_a: Tensor, g_ent: Tensor | None) -> Tensor:
    """``p * (A + B * log p)`` in place of ``e`` (``p = e / s``, ``B = -g_ent``; the one-hot term is
    the caller's). With ``log p = log e - log s``, the entropy's term is
    ``(e / s) · g_ent · log s - (g_ent / s) · e log e``, where ``xlogy`` keeps ``0 · log 0`` at 0."""
    if g_ent is None:  # no entropy gradient: one multiply per element
        return e.mul_((coef_a / s).unsqueeze(1))
    scale, ent_scale = (coef_a + g_ent * s.log()) / s, g_ent / s
    for blk in _blocks(e.shape[0]):
        e_log_e = torch.xlogy(e[blk], e[blk])
        e[blk].mul_(scale[blk, None]).sub_(e_log_e.mul_(ent_scale[blk, None]))
    return e


def head_loss_in_forward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                         chunk_loss: Callable[[slice, Tensor, Tensor], tuple[Tensor, Any]], rows: int,
                         ) -> tuple[Tensor, Tensor, Tensor, list[Any]]:
    """The loss ``Σ_chunks chunk_loss(...)`` with its head gradient formed chunk by chunk.

    Args:
        hidden: ``[N, C, H]`` last hidden states at the completion positions (grad flows back).
        weight: ``[V, H]`` head weight (a parameter or a LoRA head's effective weight); ``bias``: ``[V]`` or None.
        targets: ``[N, C]`` completion token ids.
        temperature: logits are divided by it.
        chunk_loss: ``(rows, logp [r, C], entropy [r, C]) -> (loss share, anything)``: the objective on
            rows ``rows`` alone, its shares adding up to the whole loss (global normalisers).
        rows: rows per chunk (`rows_per_chunk` with the accumulation dtype's item size), at least 1.

    Returns:
        ``(loss, logp [N, C], entropy [N, C], extras)``: the loss differentiable in ``hidden``,
        ``weight`` and ``bias``; log-probs and entropies detached, in the accumulation dtype;
        each chunk's second value in order.

    Raises:
        FloatingPointError: a chunk's gradient is not finite (the rows are named).

    Examples:
        >>> h, w = torch.randn(3, 2, 8, requires_grad=True), torch.randn(11, 8, requires_grad=True)
        >>> t = torch.tensor([[1, 2], [3, 4], [5, 6]])
        >>> loss, logp, ent, _ = head_loss_in_forward(h, w, None, t, 1.0, lambda r, lp, e: (-lp.sum(), None), 2)
        >>> loss.backward()
        >>> ref = -(h @ w.T).log_softmax(-1).gather(-1, t[..., None]).sum()
        >>> torch.allclose(torch.autograd.grad(ref, h)[0], h.grad, atol=1e-5)
        True
    """
    n, c, width = hidden.shape
    cdt = compute_dtype(hidden.dtype, weight.dtype)
    inv_t = 1.0 / temperature
    with torch.no_grad():
        w = weight.detach().to(cdt)
        b = None if bias is None else bias.detach().to(cdt) * inv_t
        h = hidden.detach()
        d_h = torch.empty(h.shape, dtype=cdt, device=h.device) if hidden.requires_grad else None
        d_w = torch.zeros(w.shape, dtype=cdt, device=w.device) if weight.requires_grad else None
        d_b = torch.zeros(w.shape[0], dtype=cdt, device=w.device) if bias is not None and bias.requires_grad else None
        logp_out = torch.empty(n, c, dtype=cdt, device=h.device)
        ent_out = torch.empty(n, c, dtype=cdt, device=h.device)
        flat = torch.empty(min(rows, n) * c * w.shape[0], dtype=cdt, device=h.device)
    total, extras = torch.zeros((), dtype=torch.float64, device=h.device), []
    for r0 in range(0, n, rows):
        span = slice(r0, min(r0 + rows, n))
        t = (span.stop - r0) * c
        with torch.no_grad():
            u = h[span].reshape(t, width).to(cdt) * inv_t
            e, sums, logp, entropy = _chunk_softmax(u, w, b, targets[span].reshape(t),
                                                    flat[:t * w.shape[0]].view(t, -1))
        lp = logp.view(-1, c).requires_grad_()
        ent = entropy.view(-1, c).requires_grad_()
        with torch.enable_grad():
            share, extra = chunk_loss(span, lp, ent)
        g_lp, g_ent = torch.autograd.grad(share, [lp, ent], allow_unused=True)
        extras.append(extra)
        total += share.detach().double()
        logp_out[span], ent_out[span] = lp.detach(), ent.detach()
        with torch.no_grad():
            _check_finite(g_lp, g_ent, span)
            g, g_e, coef_a = row_coefficients(None if g_lp is None else g_lp.reshape(t),
                                              None if g_ent is None else g_ent.reshape(t), entropy,
                                              torch.ones(t, dtype=torch.bool, device=h.device), cdt)
            dz = _logits_grad_(e, sums, coef_a, g_e)
            dz.scatter_add_(1, targets[span].reshape(t, 1), g.unsqueeze(1))
            if d_h is not None:
                torch.mm(dz, w, out=d_h[span].view(t, width)).mul_(inv_t)
            if d_w is not None:
                d_w.addmm_(dz.T, u)
            if d_b is not None:
                d_b += dz.sum(0) * inv_t
    value = total.to(cdt)
    grads = (None if d_h is None else d_h.to(hidden.dtype), None if d_w is None else d_w.to(weight.dtype),
             None if d_b is None else d_b.to(bias.dtype))
    loss = _Injected.apply(value, hidden, weight, bias, grads)
    return loss, logp_out, ent_out, extras


def _check_finite(g_lp: Tensor | None, g_ent: Tensor | None, span: slice) -> None:
    """A non-finite upstream gradient would poison ``d W`` for every row: stop, naming the chunk."""
    for name, g in (("log-probs", g_lp), ("entropies", g_ent)):
        if g is not None and not bool(torch.isfinite(g).all()):
            raise FloatingPointError(
                f"the loss's gradient with respect to the {name} of rows {span.start}..{span.stop - 1} of this "
                "micro-batch is not finite (head gradient in the forward pass): the step is stopped before it "
                "reaches the weights. Check those rows' advantages, old and reference log-probs")
