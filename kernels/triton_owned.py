"""A Triton backward without atomics: every program owns the gradient rows it writes.

`triton_logprobs`' backward runs one program per (token block, vocabulary tile) and adds its
share into ``dW`` (and ``dh``) with ``tl.atomic_add``: ``N / BLOCK_N`` atomic additions land on
every weight element, in an order that changes from run to run. Here two kernels split the work
by owner instead:

* ``_dw_kernel``: one program per vocabulary tile. It loops over all token blocks, recomputes
  the ``[BLOCK_N, BLOCK_V]`` logits tile, forms ``dz`` and adds ``dzᵀ @ h`` into the ``dW`` rows
  it alone owns (a plain load and store per ``BLOCK_H`` slice), and sums ``db`` in registers.
* ``_dh_kernel``: one program per token block, looping over the vocabulary tiles, adding
  ``dz @ W`` into its own ``dh`` rows.

No atomics, and the gradients are bitwise reproducible (a fixed summation order). The price:
the logits tiles are recomputed twice (once per kernel) instead of once — 5 matmul passes over
``N·V·H`` for forward + backward instead of 4 — and the read-modify-write of each owned slice
per tile is memory traffic the atomics also had. Which wins is measured, not assumed: `choose`
times both at first use.

Not chosen: Cut Cross-Entropy's gradient filtering (Wijmans et al. 2024, arXiv 2411.09009),
which skips tiles whose softmax is below bf16 resolution. It saves most of the backward on real
(peaked) LM softmaxes but changes the gradients by up to its threshold, and every implementation
here must equal the chunked reference; it would also keep the atomics.

Runs compiled on CUDA and under ``TRITON_INTERPRET=1`` on CPU (tiny fp32 shapes only).
"""
from __future__ import annotations

import torch  # noqa: F401  (the docstring example's namespace)
import triton
import triton.language as tl
from torch import Tensor

from .triton_logprobs import BLOCK_H, BLOCK_N, BLOCK_V, BackwardOperands, dz_tile


@triton.jit
def _dw_kernel(h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, dw_ptr, db_ptr, N, V, H, inv_t,
               HAS_BIAS: tl.constexpr, WITH_ENTROPY: tl.constexpr, PRECISION: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    cols = (tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
    col_ok = cols < V
    db = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        rows = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        row_ok = rows < N
        dz = dz_tile(h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, rows, cols, row_ok, col_ok,
                     H, inv_t, HAS_BIAS, WITH_ENTROPY, PRECISION, BLOCK_N, BLOCK_V, BLOCK_H)
        if HAS_BIAS:
            db += tl.sum(dz, axis=0)
        dz_in = tl.trans(dz.to(w_ptr.dtype.element_ty))  # tensor-core operand; the dot accumulates in fp32
        for k in range(0, H, BLOCK_H):
            ks = k + tl.arange(0, BLOCK_H)
            k_ok = ks < H
            x = tl.load(h_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            at, ok = dw_ptr + cols[:, None] * H + ks[None, :], col_ok[:, None] & k_ok[None, :]
            acc = tl.load(at, mask=ok, other=0.0) + tl.dot(dz_in, x.to(dz_in.dtype), input_precision=PRECISION)
            tl.store(at, acc, mask=ok)
    if HAS_BIAS:
        tl.store(db_ptr + cols, db, mask=col_ok)


@triton.jit
def _dh_kernel(h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, dh_ptr, N, V, H, inv_t,
               HAS_BIAS: tl.constexpr, WITH_ENTROPY: tl.constexpr, PRECISION: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < N
    for v0 in range(0, V, BLOCK_V):
        cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < V
        dz = dz_tile(h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, rows, cols, row_ok, col_ok,
                     H, inv_t, HAS_BIAS, WITH_ENTROPY, PRECISION, BLOCK_N, BLOCK_V, BLOCK_H)
        dz_in = dz.to(w_ptr.dtype.element_ty)
        for k in range(0, H, BLOCK_H):
            ks = k + tl.arange(0, BLOCK_H)
            k_ok = ks < H
            w = tl.load(w_ptr + cols[:, None] * H + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            at, ok = dh_ptr + rows[:, None] * H + ks[None, :], row_ok[:, None] & k_ok[None, :]
            acc = tl.load(at, mask=ok, other=0.0) + tl.dot(dz_in, w, input_precision=PRECISION)
            tl.store(at, acc, mask=ok)


def triton_owned_backward(grad_logp: Tensor | None, grad_entropy: Tensor | None, hidden: Tensor, weight: Tensor,
                          bias: Tensor | None, targets: Tensor, lse: Tensor, entropy: Tensor | None,
                          temperature: float, ignore_index: int, need_hidden: bool = True, need_weight: bool = True,
                          *, block_n: int = BLOCK_N, block_v: int = BLOCK_V, block_h: int = BLOCK_H
                          ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Same contract as `chunked.chunked_backward`; only the kernels for wanted gradients run.

    Args:
        block_n, block_v, block_h: tile sizes (each >= 16; powers of two); the rest as for
            `chunked.chunked_backward`.

    Example (CPU, ``TRITON_INTERPRET=1``):
        >>> from lightning_rlpt.kernels.triton_logprobs import triton_forward
        >>> h, w, t = torch.randn(5, 8), torch.randn(40, 8), torch.arange(5)
        >>> logp, ent, lse = triton_forward(h, w, None, t, 1.0, -100, True, block_v=16)
        >>> dh, dw, _ = triton_owned_backward(torch.ones(5), None, h, w, None, t, lse, ent, 1.0, -100, block_v=16)
    """
    ops = BackwardOperands(grad_logp, grad_entropy, hidden, weight, bias, targets, lse, entropy, ignore_index,
                           need_hidden, need_weight)
    common = dict(HAS_BIAS=bias is not None, WITH_ENTROPY=ops.with_entropy, PRECISION=ops.precision,
                  BLOCK_N=block_n, BLOCK_V=block_v, BLOCK_H=block_h)
    sizes = (ops.n, ops.vocab, ops.width, 1.0 / temperature)
    if ops.n and need_weight:
        _dw_kernel[(triton.cdiv(ops.vocab, block_v),)](*ops.inputs, ops.d_w, ops.d_b, *sizes, **common)
    if ops.n and need_hidden:
        _dh_kernel[(triton.cdiv(ops.n, block_n),)](*ops.inputs, ops.d_h, *sizes, **common)
    return ops.gradients()

