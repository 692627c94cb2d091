"""Chunked PyTorch log-probs and entropy: the CPU path and the reference for the Triton kernels.

The vocabulary is walked in tiles of ``VOCAB_TILE`` columns and the tokens in chunks of
``TOKEN_CHUNK`` rows, so at most one ``[chunk, tile]`` block of logits (and one of its
log-softmax) exists at a time. Each row keeps three running numbers over the tiles seen so
far, relative to a reference point ``m`` (here: a log-sum-exp)::

    s = sum exp(z - m)              a = sum exp(z - m) * (z - m)

which give ``lse = m + log s`` and ``entropy = log s - a / s`` at the end (derivation in
``docs/kernels.md``). The backward pass recomputes each tile from the saved ``lse`` and
entropy. Matmuls run in float32 for bf16/fp16 inputs (float64 for float64 inputs).
"""
from __future__ import annotations

import torch
from torch import Tensor

# 1024 x 4096 fp32 logits = 16 MiB per tile, two tiles live at a time. Smaller tiles mean more
# (and smaller) ops per pass, which costs time on busy machines; bigger ones cost memory.
# Read at call time, so tests may patch them.
TOKEN_CHUNK = 1024
VOCAB_TILE = 4096


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any input is float64, else float32 (the accumulation dtype)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def merge_lse(state: tuple[Tensor, Tensor, Tensor] | None, m2: Tensor, s2: Tensor,
              a2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Combine two partial (max, sum-exp, sum-exp-times-shifted-logit) states of the same rows.

    ``a`` is relative to its own max, so moving it to the common max ``M`` adds ``s * (m - M)``.
    """
    if state is None:
        return m2, s2, a2
    m1, s1, a1 = state
    big = torch.maximum(m1, m2)
    w1, w2 = (m1 - big).exp(), (m2 - big).exp()
    s = s1 * w1 + s2 * w2
    a = w1 * (a1 + s1 * (m1 - big)) + w2 * (a2 + s2 * (m2 - big))
    return big, s, a


class _Scratch:
    """Two reusable tile buffers: fresh 8 MiB tensors per tile would page-fault every time."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device):
        self.flat = [torch.empty(rows * cols, dtype=dtype, device=device) for _ in range(2)]

    def get(self, i: int, rows: int, cols: int) -> Tensor:
        return self.flat[i][: rows * cols].view(rows, cols)  # contiguous, unlike a 2-D slice


def _prepare(hidden, weight, bias, targets, temperature, ignore_index):
    """Accumulation dtype, bias with 1/T folded in, valid-row mask and safe target ids."""
    cdt = compute_dtype(hidden.dtype, weight.dtype)
    b = None if bias is None else bias.to(cdt) / temperature
    valid = targets != ignore_index
    return cdt, b, valid, torch.where(valid, targets, 0)


def _scaled_rows(hidden: Tensor, rows: slice, cdt: torch.dtype, temperature: float) -> Tensor:
    """``hidden[rows] / T`` in the accumulation dtype (a view when nothing changes)."""
    u = hidden[rows].to(cdt)
    return u if temperature == 1.0 else u / temperature


def _sizes(n: int, vocab: int, token_chunk: int | None, vocab_tile: int | None) -> tuple[int, int]:
    return min(n, token_chunk or TOKEN_CHUNK) or 1, min(vocab, vocab_tile or VOCAB_TILE)


def _target_in_tile(targets: Tensor, v0: int, cols: int) -> tuple[Tensor, Tensor]:
    """(column of each row's target in this tile, clamped; whether it is really there)."""
    inside = (targets >= v0) & (targets < v0 + cols)
    return (targets - v0).clamp(0, cols - 1).unsqueeze(1), inside


@torch.no_grad()
def chunked_forward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                    ignore_index: int, with_entropy: bool, *, token_chunk: int | None = None,
                    vocab_tile: int | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
    """Log-probs, entropies (or None) and log-sum-exps of ``[N, H]`` hidden states.

    Args:
        hidden: ``[N, H]`` last hidden states.
        weight: ``[V, H]`` LM-head weight; ``bias``: ``[V]`` or None.
        targets: ``[N]`` token ids; rows equal to ``ignore_index`` get log-prob 0 and entropy 0.
        temperature: logits are divided by it.
        with_entropy: compute the entropy (else return None for it).
        token_chunk, vocab_tile: block sizes (default ``TOKEN_CHUNK``, ``VOCAB_TILE``).

    Returns:
        ``(logp, entropy, lse)``, each ``[N]`` in float32 (float64 for float64 inputs).

    Examples:
        >>> h, w = torch.randn(5, 8), torch.randn(11, 8)
        >>> logp, ent, lse = chunked_forward(h, w, None, torch.tensor([0, 1, 2, 3, -100]), 1.0, -100, True)
        >>> torch.allclose(logp[:4], (h @ w.T).log_softmax(-1)[range(4), [0, 1, 2, 3]], atol=1e-5)
        True
    """
    cdt, b, valid, safe = _prepare(hidden, weight, bias, targets, temperature, ignore_index)
    n, vocab, device = hidden.shape[0], weight.shape[0], hidden.device
    chunk, tile = _sizes(n, vocab, token_chunk, vocab_tile)
    m, s, a, z_target = (torch.zeros(n, dtype=cdt, device=device) for _ in range(4))
    scratch = _Scratch(chunk, tile, cdt, device)
    for v0 in range(0, vocab, tile):  # vocabulary outermost: each weight tile is cast once
        v1 = min(v0 + tile, vocab)
        w = weight[v0:v1].to(cdt)
        for r0 in range(0, n, chunk):
            rows = slice(r0, min(r0 + chunk, n))
            u, z = _scaled_rows(hidden, rows, cdt, temperature), scratch.get(0, rows.stop - r0, v1 - v0)
            if b is None:
                torch.mm(u, w.T, out=z)
            else:
                torch.addmm(b[v0:v1], u, w.T, out=z)
            col, inside = _target_in_tile(safe[rows], v0, v1 - v0)
            z_target[rows] = torch.where(inside, z.gather(1, col).squeeze(1), z_target[rows])
            # The tile's own log-sum-exp is its reference point: then s = 1 and
            # a = sum p log p over the tile (p, log p normalised within the tile).
            log_p = torch.log_softmax(z, 1, out=scratch.get(1, *z.shape))
            lse_t = z[:, 0] - log_p[:, 0]
            if with_entropy:
                p = torch.exp(log_p, out=z)
                a_t = torch.bmm(p.unsqueeze(1), log_p.unsqueeze(2)).view(-1)  # row-wise dot
            else:
                a_t = torch.zeros_like(lse_t)
            state = None if v0 == 0 else (m[rows], s[rows], a[rows])
            m[rows], s[rows], a[rows] = merge_lse(state, lse_t, torch.ones_like(lse_t), a_t)
    lse = m + s.log()
    logp = (z_target - lse).masked_fill_(~valid, 0.0)
    ent = (s.log() - a / s).masked_fill_(~valid, 0.0) if with_entropy else None
    return logp, ent, lse


def row_coefficients(grad_logp: Tensor | None, grad_entropy: Tensor | None, entropy: Tensor | None,
                     valid: Tensor, cdt: torch.dtype) -> tuple[Tensor, Tensor | None, Tensor]:
    """Per-row ``(g, g_ent, A)`` of ``dz = g * onehot + p * (A + B * log p)``, ``B = -g_ent``.

    ``A = -(g + g_ent * entropy)``. Ignored rows contribute nothing: their upstream gradients
    are zeroed here, once. ``g_ent`` is None when the entropy's gradient is (then ``B = 0``).
    """
    g = (valid.new_zeros(valid.shape, dtype=cdt) if grad_logp is None else grad_logp.to(cdt)).masked_fill(~valid, 0.0)
    g_ent = None if grad_entropy is None else grad_entropy.to(cdt).masked_fill(~valid, 0.0)
    coef_a = -g if g_ent is None else -(g + g_ent * entropy.to(cdt))
    return g, g_ent, coef_a


def softmax_grad_(logp: Tensor, out: Tensor, coef_a: Tensor, g_ent: Tensor | None) -> Tensor:
    """``p * (A + B * log p)`` of a ``[rows, cols]`` block of log-probs into ``out`` (the
    one-hot term is the caller's); overwrites ``logp`` when the entropy term is there."""
    dz = torch.exp(logp, out=out)
    if g_ent is None:  # no entropy gradient: not one flop of its terms
        return dz.mul_(coef_a.unsqueeze(1))
    return dz.mul_(logp.mul_(-g_ent.unsqueeze(1)).add_(coef_a.unsqueeze(1)))


@torch.no_grad()
def chunked_backward(grad_logp: Tensor | None, grad_entropy: Tensor | None, hidden: Tensor, weight: Tensor,
                     bias: Tensor | None, targets: Tensor, lse: Tensor, entropy: Tensor | None,
                     temperature: float, ignore_index: int, need_hidden: bool = True, need_weight: bool = True, *,
                     token_chunk: int | None = None, vocab_tile: int | None = None
                     ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients ``(d hidden, d weight, d bias)`` from upstream grads of log-probs and entropies.

    Per tile, with ``z`` the tempered logits: ``dz = g * onehot - p * (g + g_ent * (log p + entropy))``
    and, through ``z = (h @ W.T + b) / T``: ``dh = dz @ W / T``, ``dW = dz.T @ (h / T)``, ``db = sum(dz) / T``.

    Args:
        grad_logp, grad_entropy: ``[N]`` upstream gradients (None = zero).
        hidden, weight, bias, targets, temperature, ignore_index: as for `chunked_forward`.
        lse, entropy: ``[N]`` from `chunked_forward` (``entropy`` needed only with ``grad_entropy``).
        need_hidden, need_weight: skip the gradients nobody asked for (``need_weight`` covers bias).

    Returns:
        Gradients in the dtypes of their inputs; None where not needed (or no bias).

    Examples:
        >>> h, w, t = torch.randn(4, 8), torch.randn(11, 8), torch.tensor([1, 2, 3, 4])
        >>> logp, ent, lse = chunked_forward(h, w, None, t, 1.0, -100, True)
        >>> dh, dw, db = chunked_backward(torch.ones(4), None, h, w, None, t, lse, ent, 1.0, -100)
        >>> dh.shape, dw.shape, db
        (torch.Size([4, 8]), torch.Size([11, 8]), None)
    """
    cdt, b, valid, safe = _prepare(hidden, weight, bias, targets, temperature, ignore_index)
    (n, width), vocab = hidden.shape, weight.shape[0]
    zeros = dict(dtype=cdt, device=hidden.device)
    g, g_ent, coef_a = row_coefficients(grad_logp, grad_entropy, entropy, valid, cdt)
    d_h = torch.zeros(hidden.shape, **zeros) if need_hidden else None
    d_w = torch.empty_like(weight) if need_weight else None  # filled tile by tile, in weight's dtype
    d_b = torch.zeros(vocab, **zeros) if need_weight and bias is not None else None
    chunk, tile = _sizes(n, vocab, token_chunk, vocab_tile)
    scratch = _Scratch(chunk, tile, cdt, hidden.device)
    for v0 in range(0, vocab, tile):
        v1 = min(v0 + tile, vocab)
        w = weight[v0:v1].to(cdt)
        # dW of this tile sums over all token chunks, in cdt: in place, or in a tile buffer
        # stored once when the weight's dtype is narrower.
        d_w_tile = None
        if d_w is not None:
            d_w_tile = d_w[v0:v1].zero_() if d_w.dtype == cdt else torch.zeros(v1 - v0, width, **zeros)
        for r0 in range(0, n, chunk):
            rows = slice(r0, min(r0 + chunk, n))
            u, logp = _scaled_rows(hidden, rows, cdt, temperature), scratch.get(0, rows.stop - r0, v1 - v0)
            if b is None:  # log p straight out of the matmul: addmm's "input" broadcasts -lse
                torch.addmm(-lse[rows].to(cdt).unsqueeze(1), u, w.T, out=logp)
            else:
                torch.addmm(b[v0:v1], u, w.T, out=logp).sub_(lse[rows].to(cdt).unsqueeze(1))
            dz = softmax_grad_(logp, scratch.get(1, *logp.shape), coef_a[rows], None if g_ent is None else g_ent[rows])
            col, inside = _target_in_tile(safe[rows], v0, v1 - v0)
            dz.scatter_add_(1, col, torch.where(inside, g[rows], 0.0).unsqueeze(1))
            if d_h is not None:
                d_h[rows].addmm_(dz, w)
            if d_w_tile is not None:
                d_w_tile.addmm_(dz.T, u)
            if d_b is not None:
                d_b[v0:v1] += dz.sum(0)
        if d_w_tile is not None and d_w.dtype != cdt:
            d_w[v0:v1] = d_w_tile
    inv_t = 1.0 / temperature
    return (None if d_h is None else d_h.mul_(inv_t).to(hidden.dtype),
            d_w,
            None if d_b is None else d_b.mul_(inv_t).to(bias.dtype))


def reference_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                       temperature: float = 1.0, ignore_index: int = -100) -> tuple[Tensor, Tensor]:
    """The naive path, differentiable by autograd: full ``[..., V]`` logits in float32/float64.

    Examples:
        >>> logp, ent = reference_logprobs(torch.zeros(2, 4), torch.zeros(8, 4), torch.tensor([0, -100]))
        >>> logp.tolist(), [round(x, 4) for x in ent.tolist()]
        ([-2.079441547393799, 0.0], [2.0794, 0.0])
    """
    cdt = compute_dtype(hidden.dtype, weight.dtype)
    logits = hidden.to(cdt) @ weight.to(cdt).T
    if bias is not None:
        logits = logits + bias.to(cdt)
    logp_all = (logits / temperature).log_softmax(-1)
    valid = targets != ignore_index
    logp = logp_all.gather(-1, torch.where(valid, targets, 0).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp.masked_fill(~valid, 0.0), entropy.masked_fill(~valid, 0.0)
