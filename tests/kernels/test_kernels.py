"""fused_logprobs (both PyTorch implementations, custom op, autograd, compile) against the naive reference.

Tolerances: fp64 1e-12; fp32 1e-5 absolute on log-probs/entropies and 1e-5 + 1e-4 relative on
gradients; bf16 inputs: log-probs/entropies still within 1e-5 of an fp64 evaluation of the
same bf16 numbers (fp32 accumulation), gradients within bf16 rounding (1 % of their scale).
"""
from __future__ import annotations

import functools
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_rlpt.kernels import chunked, full_vocab, fused_logprobs, reference_logprobs
from lightning_rlpt.kernels.fused_logprobs import _fwd

TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-5, None)}


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles far smaller than the shapes, and V never a multiple of the vocab tile; full_vocab
    blocks of a few rows (4 at V = 37 in fp32), so several chunks run."""
    monkeypatch.setattr(chunked, "TOKEN_CHUNK", 4)
    monkeypatch.setattr(chunked, "VOCAB_TILE", 16)
    monkeypatch.setattr(full_vocab, "BLOCK_BYTES", 600)


def make(lead, hidden_size, vocab, dtype, bias=True, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    h = (torch.randn(*lead, hidden_size, generator=gen) * scale).to(dtype).requires_grad_()
    w = torch.randn(vocab, hidden_size, generator=gen).to(dtype).requires_grad_()
    b = torch.randn(vocab, generator=gen).to(dtype).requires_grad_() if bias else None
    t = torch.randint(0, vocab, lead, generator=gen)
    t.view(-1)[1 % t.numel()] = -100  # one ignored position (the only one when N == 1)
    return h, w, b, t


def grads(h, w, b, t, fn, temperature, seed=1):
    """Outputs and gradients of a random weighted sum of log-probs and entropies."""
    logp, ent = fn(h, w, t, bias=b, temperature=temperature)
    gen = torch.Generator().manual_seed(seed)
    c1, c2 = torch.randn(t.shape, generator=gen, dtype=logp.dtype), torch.randn(t.shape, generator=gen, dtype=logp.dtype)
    leaves = [x for x in (h, w, b) if x is not None]
    return logp, ent, torch.autograd.grad((logp * c1).sum() + (ent * c2).sum(), leaves)


def fp64_leaves(h, w, b):
    return [None if x is None else x.detach().double().requires_grad_() for x in (h, w, b)]


@pytest.mark.parametrize("impl", ["chunked", "full_vocab"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("lead, hidden_size, vocab", [((1,), 8, 5), ((13,), 8, 37), ((2, 5), 16, 50)])
@pytest.mark.parametrize("bias, temperature", [(True, 0.7), (False, 1.0)])
def test_matches_naive_reference(impl, dtype, lead, hidden_size, vocab, bias, temperature):
    h, w, b, t = make(lead, hidden_size, vocab, dtype, bias)
    logp, ent, got = grads(h, w, b, t, functools.partial(fused_logprobs, impl=impl), temperature)
    ref_logp, ref_ent, want = grads(*fp64_leaves(h, w, b), t, reference_logprobs, temperature)
    assert logp.shape == ent.shape == t.shape
    assert logp.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    out_tol, grad_rtol = TOL[dtype]
    torch.testing.assert_close(logp.double(), ref_logp, atol=out_tol, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=out_tol, rtol=0)
    for g, r, x in zip(got, want, [x for x in (h, w, b) if x is not None]):
        assert g.dtype == dtype and g.shape == x.shape
        if dtype == torch.bfloat16:
            torch.testing.assert_close(g.double(), r, atol=1e-2 * r.abs().max().item(), rtol=1e-2)
        else:
            torch.testing.assert_close(g.double(), r, atol=out_tol, rtol=grad_rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bf16_autocast_does_not_reach_inside(dtype):
    """Lightning's ``precision="bf16-mixed"`` runs the training step, backward included, under
    CPU autocast; the kernel still accumulates in fp32: outputs and gradients bit-equal to a run
    without autocast. (Before the fix the entropy's ``bmm`` ran in bf16, off by ~1e-2.)"""
    h, w, b, t = make((13,), 64, 37, dtype, scale=0.3)
    plain_logp, plain_ent, plain_grads = grads(h, w, b, t, fused_logprobs, 0.7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent, got = grads(h, w, b, t, fused_logprobs, 0.7)
    assert logp.dtype == ent.dtype == torch.float32
    assert torch.equal(logp, plain_logp) and torch.equal(ent, plain_ent)
    assert all(torch.equal(g, r) for g, r in zip(got, plain_grads))


def test_uniform_logits_give_log_vocab_by_hand():
    # Zero weights: every logit is 0, so log p = -log V and the entropy is log V.
    logp, ent = fused_logprobs(torch.randn(3, 4), torch.zeros(50, 4), torch.tensor([0, 49, -100]))
    assert logp.tolist() == pytest.approx([-math.log(50), -math.log(50), 0.0], abs=1e-6)
    assert ent.tolist() == pytest.approx([math.log(50), math.log(50), 0.0], abs=1e-6)


def test_two_token_vocab_by_hand():
    # Logits (2, 0) / T=2 -> (1, 0): p = (e/(e+1), 1/(e+1)); gradient of log p_0 w.r.t. hidden = (1 - p0) * (w0 - w1) / T.
    h = torch.tensor([[2.0]], requires_grad=True)
    w = torch.tensor([[1.0], [0.0]])
    logp, ent = fused_logprobs(h, w, torch.tensor([0]), temperature=2.0)
    p0 = math.e / (math.e + 1)
    assert logp.item() == pytest.approx(math.log(p0), abs=1e-6)
    assert ent.item() == pytest.approx(-(p0 * math.log(p0) + (1 - p0) * math.log(1 - p0)), abs=1e-6)
    (dh,) = torch.autograd.grad(logp.sum(), h)
    assert dh.item() == pytest.approx((1 - p0) * 1.0 / 2.0, abs=1e-6)


def test_ignored_positions_are_zero_and_get_no_gradient():
    h, w, b, t = make((6,), 8, 37, torch.float32)
    t[3] = -100
    logp, ent = fused_logprobs(h, w, t, bias=b)
    assert logp[[1, 3]].tolist() == [0.0, 0.0] and ent[[1, 3]].tolist() == [0.0, 0.0]
    (dh,) = torch.autograd.grad(logp.sum() + ent.sum(), h)
    assert dh[[1, 3]].abs().max().item() == 0.0 and dh[0].abs().max().item() > 0


def test_custom_ignore_index_inside_the_vocab():
    h, w, b, t = make((5,), 8, 37, torch.float32)
    t[:] = torch.tensor([0, 7, 3, 7, 9])
    logp, _ = fused_logprobs(h, w, t, ignore_index=7)
    ref, _ = reference_logprobs(h, w, t, ignore_index=7)
    assert logp[[1, 3]].tolist() == [0.0, 0.0]
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)


def test_without_entropy_returns_none_and_logprob_gradients():
    h, w, b, t = make((2, 5), 8, 37, torch.float32)
    logp, ent = fused_logprobs(h, w, t, bias=b, return_entropy=False)
    assert ent is None
    ref, _ = reference_logprobs(h, w, t, bias=b)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
    got = torch.autograd.grad(logp.sum(), (h, w, b))
    want = torch.autograd.grad(ref.sum(), (h, w, b))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


def test_peaked_logits_stay_finite_and_accurate():
    h, w, b, t = make((9,), 8, 37, torch.float32, scale=30.0)  # logits in the hundreds
    logp, ent = fused_logprobs(h, w, t, bias=b)
    ref_logp, ref_ent = reference_logprobs(*fp64_leaves(h, w, b)[:2], t, bias=b.double())
    assert torch.isfinite(logp).all() and (ent >= -1e-6).all()
    torch.testing.assert_close(logp.double(), ref_logp, atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-4, rtol=0)


def test_frozen_head_skips_weight_gradient():
    h, w, b, t = make((4,), 8, 37, torch.float32)
    w.requires_grad_(False)
    b.requires_grad_(False)
    logp, ent = fused_logprobs(h, w, t, bias=b)
    (dh,) = torch.autograd.grad(logp.sum() + ent.sum(), h)
    (ref,) = torch.autograd.grad(sum(x.sum() for x in reference_logprobs(h, w, t, bias=b)), h)
    torch.testing.assert_close(dh, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("impl", ["chunked", "full_vocab"])
def test_gradcheck_float64(impl):
    h, w, b, t = make((5,), 3, 19, torch.float64)

    def fn(h, w, b):
        return fused_logprobs(h, w, t, bias=b, temperature=0.8, impl=impl)

    assert torch.autograd.gradcheck(fn, (h, w, b))


@pytest.mark.parametrize("token_chunk, vocab_tile", [(1, 1), (3, 7), (64, 64)])
def test_chunk_and_tile_sizes_do_not_change_results(token_chunk, vocab_tile):
    h, w, b, t = make((10,), 8, 37, torch.float64)
    h, w, b = h.detach(), w.detach(), b.detach()
    logp, ent, lse = chunked.chunked_forward(h, w, b, t, 0.9, -100, True, token_chunk=token_chunk,
                                             vocab_tile=vocab_tile)
    ref_logp, ref_ent = reference_logprobs(h, w, t, bias=b, temperature=0.9)
    torch.testing.assert_close(logp, ref_logp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-12, rtol=0)
    torch.testing.assert_close(lse, torch.logsumexp((h @ w.T + b) / 0.9, -1), atol=1e-12, rtol=0)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op creates."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel())
        return out


def test_never_materialises_full_logits():
    n, hidden_size, vocab = 64, 4, 300  # N*V = 19,200; one tile is 4 x 16 = 64; dW is 1,200
    h, w, b, t = (x.detach() if x.dtype.is_floating_point else x for x in make((n,), hidden_size, vocab, torch.float32))
    with _LargestTensor() as mode:
        logp, ent, lse = chunked.chunked_forward(h, w, b, t, 1.0, -100, True)
        chunked.chunked_backward(torch.ones(n), torch.ones(n), h, w, b, t, lse, ent, 1.0, -100)
    # The dW output ([V, H]) is the largest thing allowed; N x V logits would be 16x bigger.
    assert mode.largest <= max(vocab * hidden_size, n * hidden_size, 4 * 16) < n * vocab / 8


def test_full_vocab_blocks_stay_within_their_budget(monkeypatch):
    n, hidden_size, vocab = 64, 4, 300  # BLOCK_BYTES fits 16 rows of V in fp32: 4,800 numbers < N*V = 19,200
    monkeypatch.setattr(full_vocab, "BLOCK_BYTES", 16 * vocab * 4)
    h, w, b, t = (x.detach() if x.dtype.is_floating_point else x for x in make((n,), hidden_size, vocab, torch.float32))
    with _LargestTensor() as mode:
        logp, ent, lse = full_vocab.full_vocab_forward(h, w, b, t, 1.0, -100, True)
        full_vocab.full_vocab_backward(torch.ones(n), torch.ones(n), h, w, b, t, lse, ent, 1.0, -100)
    assert full_vocab.block_rows(n, vocab, torch.float32) == 16
    assert mode.largest <= max(vocab * hidden_size, 16 * vocab) < n * vocab / 2


def test_opcheck_registrations():
    h, w, b, t = make((6,), 8, 37, torch.float32)
    torch.library.opcheck(_fwd, (h.reshape(-1, 8), w, b, t, 0.7, -100, True))


@pytest.mark.parametrize("impl", [None, "full_vocab"])
def test_torch_compile_matches_eager(impl):
    h, w, b, t = make((2, 5), 8, 37, torch.float32)

    def loss_fn(h, w, b):
        logp, ent = fused_logprobs(h, w, t, bias=b, temperature=0.7, impl=impl)
        return (logp * 2).sum() + ent.mean()

    compiled = torch.compile(loss_fn, fullgraph=True)  # fullgraph: the op must not break the graph
    loss = compiled(h, w, b)
    got = torch.autograd.grad(loss, (h, w, b))
    ref_loss = loss_fn(h, w, b)
    want = torch.autograd.grad(ref_loss, (h, w, b))
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


def _bad(**changes):
    h, w, b, t = make((2, 3), 8, 37, torch.float32)
    args = dict(hidden=h, weight=w, targets=t, bias=b, temperature=1.0)
    args.update(changes)
    return args


@pytest.mark.parametrize("changes, message", [
    (dict(weight=torch.randn(37, 9)), r"hidden \(2, 3, 8\) must end in H=9"),
    (dict(weight=torch.randn(37)), r"weight must be \[V, H\]"),
    (dict(weight=torch.randn(0, 8), bias=None), r"weight must be \[V, H\] with V >= 1"),
    (dict(targets=torch.zeros(2, 4, dtype=torch.long)), r"targets \(2, 4\) must have hidden's leading shape \(2, 3\)"),
    (dict(targets=torch.zeros(2, 3)), r"targets must be integer token ids"),
    (dict(bias=torch.randn(36)), r"bias \(36,\) must be \[V\]=\(37,\)"),
    (dict(targets=torch.tensor([[0, 1, 37], [0, 0, 0]])), r"target id 37 is outside the vocabulary \[0, 37\)"),
    (dict(targets=torch.tensor([[0, -1, 2], [0, 0, 0]])), r"target id -1 is outside the vocabulary"),
    (dict(hidden=torch.full((2, 3, 8), float("nan"))), r"hidden states contain NaN or Inf"),
    (dict(hidden=torch.ones(2, 3, 8).index_fill(2, torch.tensor([0]), float("inf"))), r"contain NaN or Inf"),
    (dict(temperature=0.0), r"temperature must be a finite Python number > 0, got 0.0"),
    (dict(temperature=-1.0), r"temperature must be .* > 0"),
    (dict(temperature=float("nan")), r"temperature must be"),
    (dict(weight=torch.randn(37, 8, device="meta")), r"hidden is on cpu but weight is on meta"),
    (dict(hidden=torch.ones(2, 3, 8, dtype=torch.long)), r"hidden has dtype torch.int64"),
])
def test_bad_input_raises_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        fused_logprobs(**_bad(**changes))


def test_full_vocab_narrow_matmuls_binding_and_cpu_probe():
    """bf16 operands into float32 outputs (``out_dtype``): the CUDA route of `full_vocab`. Its
    values need a GPU (``benchmarks/gpu_check.py`` measures them); here the call itself is checked
    on meta tensors, and the CPU probe must say no (CPU has no such kernel: operands go to fp32)."""
    a = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
    b = torch.empty(8, 5, dtype=torch.bfloat16, device="meta")
    out = torch.empty(4, 5, device="meta")
    assert full_vocab._mm(a, b, out).dtype == torch.float32
    assert full_vocab._mm(a, b, out, accumulate=True).shape == (4, 5)
    assert not full_vocab._narrow_matmuls(torch.device("cpu"), torch.bfloat16)
    h = torch.zeros(2, 8, dtype=torch.bfloat16)
    assert full_vocab._operand_dtype(h, h, torch.float32) == torch.float32
