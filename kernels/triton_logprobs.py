"""Triton kernels for fused log-probs + entropy, and their launchers.

Forward: a ``(token blocks, vocab splits)`` grid. Each program walks its share of the vocab
tiles, computing a ``[BLOCK_N, BLOCK_V]`` logits tile with ``tl.dot`` over ``BLOCK_H`` slices
of the hidden size, and keeps the online (max, sum-exp, sum-exp * shifted logit) state and
the target logit per row. The few per-split partial states are merged on the host side with
the same `merge_lse` as the chunked path (splitting the vocabulary keeps a GPU busy when
there are few token blocks).

Backward: a ``(token blocks, vocab tiles)`` grid; each program recomputes its logits tile,
forms ``dz`` from the saved lse/entropy and atomically adds ``dz @ W`` into ``dh`` and
``dz.T @ h`` into ``dW`` (float32 buffers). Atomics make the gradient sums' order, and so
their last bits, non-deterministic. `triton_owned` is the backward without atomics; both share
`dz_tile` and `BackwardOperands` from here.

Runs compiled on CUDA and, with ``TRITON_INTERPRET=1`` set before ``triton`` is imported, on
CPU tensors (slow: tiny shapes only; the interpreter gets bf16 ``tl.dot`` wrong, use fp32).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .chunked import merge_lse

BLOCK_N, BLOCK_V, BLOCK_H = 64, 128, 64  # tl.dot needs every block dim >= 16
MAX_SPLITS = 16


@triton.jit
def _logits_tile(h_ptr, w_ptr, b_ptr, rows, cols, row_ok, col_ok, H, inv_t,
                 HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """``(h[rows] @ W[cols].T + b[cols]) / T`` as a float32 ``[BLOCK_N, BLOCK_V]`` tile."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    for k in range(0, H, BLOCK_H):
        ks = k + tl.arange(0, BLOCK_H)
        k_ok = ks < H
        x = tl.load(h_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[None, :] * H + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return acc * inv_t


@triton.jit
def _forward_kernel(h_ptr, w_ptr, b_ptr, t_ptr, m_ptr, s_ptr, a_ptr, zt_ptr, N, V, H, inv_t, tiles_per_split,
                    HAS_BIAS: tl.constexpr, WITH_ENTROPY: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    split = tl.program_id(1)
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # int64: rows * H may pass 2**31
    row_ok = rows < N
    tgt = tl.load(t_ptr + rows, mask=row_ok, other=0)
    # A finite start keeps 0 * (m_old - m_new) at 0 on the first tile (no -inf arithmetic).
    m = tl.full((BLOCK_N,), -1.0e30, dtype=tl.float32)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    a = tl.zeros((BLOCK_N,), dtype=tl.float32)
    zt = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for i in range(0, tiles_per_split):
        cols = ((split * tiles_per_split + i) * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < V
        z = _logits_tile(h_ptr, w_ptr, b_ptr, rows, cols, row_ok, col_ok, H, inv_t, HAS_BIAS, PRECISION,
                         BLOCK_N, BLOCK_V, BLOCK_H)
        zt += tl.sum(tl.where(cols[None, :] == tgt[:, None], z, 0.0), axis=1)
        # Masked columns hold finite junk: exclude them from the max and zero their exp.
        m_new = tl.maximum(m, tl.max(tl.where(col_ok[None, :], z, -float("inf")), axis=1))
        alpha = tl.exp(m - m_new)
        shifted = z - m_new[:, None]
        e = tl.where(col_ok[None, :], tl.exp(shifted), 0.0)
        if WITH_ENTROPY:
            a = alpha * (a + s * (m - m_new)) + tl.sum(e * shifted, axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        m = m_new
    out = split * N + rows
    tl.store(m_ptr + out, m, mask=row_ok)
    tl.store(s_ptr + out, s, mask=row_ok)
    tl.store(a_ptr + out, a, mask=row_ok)
    tl.store(zt_ptr + out, zt, mask=row_ok)


@triton.jit
def dz_tile(h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, rows, cols, row_ok, col_ok, H, inv_t,
            HAS_BIAS: tl.constexpr, WITH_ENTROPY: tl.constexpr, PRECISION: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """``dz / T`` of one float32 ``[BLOCK_N, BLOCK_V]`` tile (zero outside the matrix), recomputed
    from the saved lse/entropy: the gradient through ``z = (h @ W.T + b) / T`` wants it over T."""
    z = _logits_tile(h_ptr, w_ptr, b_ptr, rows, cols, row_ok, col_ok, H, inv_t, HAS_BIAS, PRECISION,
                     BLOCK_N, BLOCK_V, BLOCK_H)
    tgt = tl.load(t_ptr + rows, mask=row_ok, other=0)
    g = tl.load(glp_ptr + rows, mask=row_ok, other=0.0)  # already 0 on ignored rows
    logp = z - tl.load(lse_ptr + rows, mask=row_ok, other=0.0)[:, None]
    p = tl.exp(logp)
    coef = g[:, None] + tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    if WITH_ENTROPY:
        ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
        ge = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
        coef += ge[:, None] * (logp + ent[:, None])
    dz = tl.where(cols[None, :] == tgt[:, None], g[:, None], 0.0) - p * coef
    return tl.where(row_ok[:, None] & col_ok[None, :], dz, 0.0) * inv_t


@triton.jit
def _backward_kernel(h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, dh_ptr, dw_ptr, db_ptr,
                     N, V, H, inv_t, HAS_BIAS: tl.constexpr, WITH_ENTROPY: tl.constexpr,
                     NEED_HIDDEN: tl.constexpr, NEED_WEIGHT: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
    row_ok, col_ok = rows < N, cols < V
    dz = dz_tile(h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, rows, cols, row_ok, col_ok, H,
                 inv_t, HAS_BIAS, WITH_ENTROPY, PRECISION, BLOCK_N, BLOCK_V, BLOCK_H)
    if HAS_BIAS and NEED_WEIGHT:
        tl.atomic_add(db_ptr + cols, tl.sum(dz, axis=0), mask=col_ok)
    dz_in = dz.to(w_ptr.dtype.element_ty)  # tensor-core operands; the dots accumulate in fp32
    for k in range(0, H, BLOCK_H):
        ks = k + tl.arange(0, BLOCK_H)
        k_ok = ks < H
        if NEED_HIDDEN:
            w = tl.load(w_ptr + cols[:, None] * H + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            tl.atomic_add(dh_ptr + rows[:, None] * H + ks[None, :], tl.dot(dz_in, w, input_precision=PRECISION),
                          mask=row_ok[:, None] & k_ok[None, :])
        if NEED_WEIGHT:
            x = tl.load(h_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            tl.atomic_add(dw_ptr + cols[:, None] * H + ks[None, :],
                          tl.dot(tl.trans(dz_in), x.to(dz_in.dtype), input_precision=PRECISION),
                          mask=col_ok[:, None] & k_ok[None, :])


def _common(hidden: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """Contiguous operands of one dtype (tl.dot needs both sides alike)."""
    dt = torch.promote_types(hidden.dtype, weight.dtype)
    return hidden.to(dt).contiguous(), weight.to(dt).contiguous()


def _precision(dtype: torch.dtype) -> str:
    # fp32 follows torch's matmul setting (IEEE unless the user allowed TF32); bf16/fp16 dots
    # ignore it, so they keep Triton's default.
    return "ieee" if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"


def triton_forward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                   ignore_index: int, with_entropy: bool, *, block_n: int = BLOCK_N, block_v: int = BLOCK_V,
                   block_h: int = BLOCK_H, max_splits: int = MAX_SPLITS) -> tuple[Tensor, Tensor | None, Tensor]:
    """Same contract as `chunked.chunked_forward`, computed by `_forward_kernel`.

    Args:
        hidden, weight, bias, targets, temperature, ignore_index, with_entropy: see `chunked_forward`.
        block_n, block_v, block_h: tile sizes (each >= 16; powers of two).
        max_splits: most programs that share one token block's vocabulary.

    Example (CPU, ``TRITON_INTERPRET=1``):
        >>> logp, ent, lse = triton_forward(torch.randn(5, 8), torch.randn(40, 8), None,
        ...                                 torch.arange(5), 1.0, -100, True, block_v=16)
    """
    hidden, weight = _common(hidden, weight)
    n, vocab, width = hidden.shape[0], weight.shape[0], hidden.shape[1]
    tiles = triton.cdiv(vocab, block_v)
    per_split = triton.cdiv(tiles, max(1, min(max_splits, tiles)))
    splits = triton.cdiv(tiles, per_split)  # every split starts on a tile with real columns
    m, s, a, zt = (torch.empty(splits, n, dtype=torch.float32, device=hidden.device) for _ in range(4))
    valid = targets != ignore_index
    safe = torch.where(valid, targets, 0).contiguous()
    if n:
        _forward_kernel[(triton.cdiv(n, block_n), splits)](
            hidden, weight, bias if bias is not None else weight, safe, m, s, a, zt, n, vocab, width,
            1.0 / temperature, per_split, HAS_BIAS=bias is not None, WITH_ENTROPY=with_entropy,
            PRECISION=_precision(hidden.dtype), BLOCK_N=block_n, BLOCK_V=block_v, BLOCK_H=block_h)
    state = None
    for i in range(splits):
        state = merge_lse(state, m[i], s[i], a[i])
    m, s, a = state
    lse = m + s.log()
    logp = (zt.sum(0) - lse).masked_fill_(~valid, 0.0)
    ent = (s.log() - a / s).masked_fill_(~valid, 0.0) if with_entropy else None
    return logp, ent, lse


def triton_backward(grad_logp: Tensor | None, grad_entropy: Tensor | None, hidden: Tensor, weight: Tensor,
                    bias: Tensor | None, targets: Tensor, lse: Tensor, entropy: Tensor | None, temperature: float,
                    ignore_index: int, need_hidden: bool = True, need_weight: bool = True, *,
                    block_n: int = BLOCK_N, block_v: int = BLOCK_V, block_h: int = BLOCK_H
                    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Same contract as `chunked.chunked_backward`, computed by `_backward_kernel`.

    Example (CPU, ``TRITON_INTERPRET=1``):
        >>> h, w, t = torch.randn(5, 8), torch.randn(40, 8), torch.arange(5)
        >>> logp, ent, lse = triton_forward(h, w, None, t, 1.0, -100, True, block_v=16)
        >>> dh, dw, _ = triton_backward(torch.ones(5), None, h, w, None, t, lse, ent, 1.0, -100, block_v=16)
    """
    ops = BackwardOperands(grad_logp, grad_entropy, hidden, weight, bias, targets, lse, entropy, ignore_index,
                           need_hidden, need_weight)
    if ops.n:
        _backward_kernel[(triton.cdiv(ops.n, block_n), triton.cdiv(ops.vocab, block_v))](
            *ops.inputs, ops.d_h, ops.d_w, ops.d_b, ops.n, ops.vocab, ops.width, 1.0 / temperature,
            HAS_BIAS=bias is not None, WITH_ENTROPY=ops.with_entropy, NEED_HIDDEN=need_hidden,
            NEED_WEIGHT=need_weight, PRECISION=ops.precision, BLOCK_N=block_n, BLOCK_V=block_v, BLOCK_H=block_h)
    return ops.gradients()


class BackwardOperands:
    """What a backward kernel reads and writes: contiguous inputs of one dtype, float32 upstream
    gradients (zero on ignored rows), zeroed float32 gradient buffers; a dummy pointer stands in
    for whatever is not needed (no bias, no entropy gradient, a gradient nobody wants)."""

    def __init__(self, grad_logp, grad_entropy, hidden, weight, bias, targets, lse, entropy, ignore_index,
                 need_hidden, need_weight):
        self.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        self.need = (need_hidden, need_weight, need_weight and bias is not None)
        hidden, weight = _common(hidden, weight)
        (self.n, self.width), self.vocab = hidden.shape, weight.shape[0]
        self.precision = _precision(hidden.dtype)
        f32 = dict(dtype=torch.float32, device=hidden.device)
        valid = targets != ignore_index
        g_logp = torch.zeros(self.n, **f32) if grad_logp is None else grad_logp.float()
        g_logp = g_logp.masked_fill(~valid, 0.0).contiguous()
        self.with_entropy = grad_entropy is not None
        g_ent = grad_entropy.float().masked_fill(~valid, 0.0).contiguous() if self.with_entropy else g_logp
        ent = entropy.float().contiguous() if self.with_entropy else g_logp
        self.inputs = (hidden, weight, bias if bias is not None else weight,
                       torch.where(valid, targets, 0).contiguous(), lse.float().contiguous(), ent, g_logp, g_ent)
        self.d_h = torch.zeros(self.n, self.width, **f32) if need_hidden else g_logp
        self.d_w = torch.zeros(self.vocab, self.width, **f32) if need_weight else g_logp
        self.d_b = torch.zeros(self.vocab, **f32) if self.need[2] else g_logp

    def gradients(self) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """``(d hidden, d weight, d bias)`` in their inputs' dtypes; None where not needed."""
        return tuple(buf.to(dt) if need else None
                     for buf, dt, need in zip((self.d_h, self.d_w, self.d_b), self.dtypes, self.need))

