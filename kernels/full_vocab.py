"""Token chunks over the whole vocabulary on plain matmuls (Liger-Kernel's fused linear
cross-entropy design), for log-probs and entropy.

Tokens are taken as many at a time as fit one ``[rows, V]`` float32 block in ``BLOCK_BYTES``.
Per chunk: one matmul for the logits (cuBLAS on CUDA), ATen's fused ``log_softmax`` for the
float32 softmax statistics; the backward recomputes the block, forms ``dz`` and does
``dh = dz @ W`` and ``dW += dzᵀ h``. Unlike `chunked` there is no vocabulary loop: fewer,
larger matmuls (what a GPU wants) for the price of a ``[rows, V]`` block (two live at a time).

bf16/fp16 operands stay in their dtype where the device multiplies them into float32 outputs
(``torch.mm(..., out_dtype=torch.float32)``, probed once per device and dtype; CUDA has it):
tensor-core speed, float32 accumulation and logits, no float32 copy of the weight, and ``dz``
rounded to the operand dtype for the two gradient matmuls (as the Triton kernels do).
Elsewhere (CPU) the operands are cast to float32 first.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .chunked import _prepare, row_coefficients, softmax_grad_

# Two [rows, V] blocks live at a time. 256 MiB: 441 rows at V = 151,936 (Liger sizes its chunks
# near N*H elements, ~128 rows at 16k tokens; bigger blocks mean fewer, fuller matmuls).
# Read at call time, so tests may patch it.
BLOCK_BYTES = 256 * 2**20

_NARROW_OK: dict[tuple[str, torch.dtype], bool] = {}


def _narrow_matmuls(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``mm``/``addmm`` of ``dtype`` operands into float32 outputs work on this device."""
    key = (device.type, dtype)
    if key not in _NARROW_OK:
        a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=dtype, device=device)
        want = torch.tensor([[7.0, 10.0], [15.0, 22.0]], device=device)
        try:
            acc = torch.ones(2, 2, device=device)
            torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
            ok = torch.equal(torch.mm(a, a, out_dtype=torch.float32), want) and torch.equal(acc, want + 1)
        except (RuntimeError, NotImplementedError, TypeError):  # CPU: no such kernel
            ok = False
        _NARROW_OK[key] = ok
    return _NARROW_OK[key]


def _operand_dtype(hidden: Tensor, weight: Tensor, cdt: torch.dtype) -> torch.dtype:
    dt = hidden.dtype
    narrow = dt == weight.dtype and dt in (torch.bfloat16, torch.float16)
    return dt if narrow and _narrow_matmuls(hidden.device, dt) else cdt


def _mm(a: Tensor, b: Tensor, out: Tensor, accumulate: bool = False) -> Tensor:
    """``out (+)= a @ b`` with ``out`` in the accumulation dtype, whatever the operands' dtype."""
    if a.dtype == out.dtype:
        return torch.addmm(out, a, b, out=out) if accumulate else torch.mm(a, b, out=out)
    if accumulate:
        return torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
    return torch.mm(a, b, out_dtype=out.dtype, out=out)


def block_rows(n: int, vocab: int, dtype: torch.dtype) -> int:
    """Token rows per ``[rows, V]`` block: as many as fit ``BLOCK_BYTES`` (at least 1)."""
    return max(1, min(n, BLOCK_BYTES // (vocab * torch.finfo(dtype).bits // 8)))


class _Blocks:
    """Two reusable ``[rows, V]`` buffers, viewed at each chunk's row count."""

    def __init__(self, rows: int, vocab: int, dtype: torch.dtype, device: torch.device):
        self.vocab, self.flat = vocab, [torch.empty(rows * vocab, dtype=dtype, device=device) for _ in range(2)]

    def get(self, i: int, rows: int) -> Tensor:
        return self.flat[i][: rows * self.vocab].view(rows, self.vocab)


def _logits(h_rows: Tensor, w: Tensor, b: Tensor | None, inv_t: float, out: Tensor) -> Tensor:
    """Tempered logits ``(h @ W.T) / T + b / T`` of one chunk into ``out`` (``b`` is pre-scaled)."""
    _mm(h_rows, w.T, out)
    if inv_t != 1.0:
        out.mul_(inv_t)
    return out if b is None else out.add_(b)


@torch.no_grad()
def full_vocab_forward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                       ignore_index: int, with_entropy: bool, *, rows: int | None = None
                       ) -> tuple[Tensor, Tensor | None, Tensor]:
    """Same contract as `chunked.chunked_forward`; ``rows``: tokens per block (default: `block_rows`).

    Examples:
        >>> h, w = torch.randn(5, 8), torch.randn(11, 8)
        >>> logp, ent, lse = full_vocab_forward(h, w, None, torch.tensor([0, 1, 2, 3, -100]), 1.0, -100, True)
        >>> torch.allclose(lse, torch.logsumexp(h @ w.T, -1), atol=1e-5)
        True
    """
    cdt, b, valid, safe = _prepare(hidden, weight, bias, targets, temperature, ignore_index)
    n, vocab, device = hidden.shape[0], weight.shape[0], hidden.device
    op, step = _operand_dtype(hidden, weight, cdt), rows or block_rows(n, vocab, cdt)
    w = weight.to(op)
    logp, lse = torch.zeros(n, dtype=cdt, device=device), torch.zeros(n, dtype=cdt, device=device)
    ent = torch.zeros(n, dtype=cdt, device=device) if with_entropy else None
    blocks = _Blocks(min(step, n) or 1, vocab, cdt, device)
    for r0 in range(0, n, step):
        r = slice(r0, min(r0 + step, n))
        z = _logits(hidden[r].to(op), w, b, 1.0 / temperature, blocks.get(0, r.stop - r0))
        log_p = torch.log_softmax(z, 1, out=blocks.get(1, r.stop - r0))
        logp[r] = log_p.gather(1, safe[r].unsqueeze(1)).squeeze(1)
        lse[r] = z[:, 0] - log_p[:, 0]
        if with_entropy:
            p = torch.exp(log_p, out=z)
            ent[r] = -torch.bmm(p.unsqueeze(1), log_p.unsqueeze(2)).view(-1)  # row-wise dot
    return logp.masked_fill_(~valid, 0.0), None if ent is None else ent.masked_fill_(~valid, 0.0), lse


@torch.no_grad()
def full_vocab_backward(grad_logp: Tensor | None, grad_entropy: Tensor | None, hidden: Tensor, weight: Tensor,
                        bias: Tensor | None, targets: Tensor, lse: Tensor, entropy: Tensor | None,
                        temperature: float, ignore_index: int, need_hidden: bool = True, need_weight: bool = True,
                        *, rows: int | None = None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Same contract as `chunked.chunked_backward`; ``rows``: tokens per block.

    Example (the entropy's gradient only, two tokens per block):
        >>> h, w, t = torch.randn(4, 8), torch.randn(11, 8), torch.tensor([1, 2, 3, -100])
        >>> logp, ent, lse = full_vocab_forward(h, w, None, t, 1.0, -100, True)
        >>> dh, dw, _ = full_vocab_backward(None, torch.ones(4), h, w, None, t, lse, ent, 1.0, -100, rows=2)
        >>> dh[3].abs().max().item()  # the ignored row gets no gradient
        0.0
    """
    cdt, b, valid, safe = _prepare(hidden, weight, bias, targets, temperature, ignore_index)
    n, vocab, device = hidden.shape[0], weight.shape[0], hidden.device
    op, step, inv_t = _operand_dtype(hidden, weight, cdt), rows or block_rows(n, vocab, cdt), 1.0 / temperature
    g, g_ent, coef_a = row_coefficients(grad_logp, grad_entropy, entropy, valid, cdt)
    w = weight.to(op)
    d_h = torch.empty(hidden.shape, dtype=cdt, device=device) if need_hidden else None  # each row written once
    d_w = torch.zeros(weight.shape, dtype=cdt, device=device) if need_weight else None
    d_b = torch.zeros(vocab, dtype=cdt, device=device) if need_weight and bias is not None else None
    blocks = _Blocks(min(step, n) or 1, vocab, cdt, device)
    for r0 in range(0, n, step):
        r = slice(r0, min(r0 + step, n))
        h_rows = hidden[r].to(op)
        logp = _logits(h_rows, w, b, inv_t, blocks.get(0, r.stop - r0)).sub_(lse[r].to(cdt).unsqueeze(1))
        dz = softmax_grad_(logp, blocks.get(1, r.stop - r0), coef_a[r], None if g_ent is None else g_ent[r])
        dz.scatter_add_(1, safe[r].unsqueeze(1), g[r].unsqueeze(1)).mul_(inv_t)  # through z = (...) / T
        if d_b is not None:
            d_b += dz.sum(0)
        dz_op = dz.to(op)
        if d_h is not None:
            _mm(dz_op, w, d_h[r])
        if d_w is not None:
            _mm(dz_op.T, h_rows, d_w, accumulate=True)
    return (None if d_h is None else d_h.to(hidden.dtype), None if d_w is None else d_w.to(weight.dtype),
            None if d_b is None else d_b.to(bias.dtype))

