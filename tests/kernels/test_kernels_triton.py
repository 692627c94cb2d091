"""The Triton kernels (``triton`` and ``triton_owned``), run by Triton's CPU interpreter, equal
the chunked PyTorch path; so does the op when forced to them by name or choosing automatically.

``TRITON_INTERPRET=1`` only takes effect if set before ``triton`` is imported, and this test
process may already have imported it (vLLM does), so every case runs in one fresh child
process; each test then checks its own case. Shapes are tiny and fp32 (the interpreter
computes bf16 ``tl.dot`` wrongly). Blocks of 16 make V, N and H span several partial blocks.
Tolerance: 1e-5 absolute (fp32, different summation orders).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import importlib, json, torch
from lightning_rlpt.kernels import chunked, choices, clear_choices, fused_logprobs, implementations
from lightning_rlpt.kernels import triton_logprobs as tri, triton_owned as own
op = importlib.import_module("lightning_rlpt.kernels.fused_logprobs")  # the module, not the function

def case(n, h, v, bias, temperature, with_entropy, ignore, splits, via_op=None, seed=0, backward=tri.triton_backward):
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, h, generator=gen), torch.randn(v, h, generator=gen)
    b = torch.randn(v, generator=gen) if bias else None
    t = torch.randint(0, v, (n,), generator=gen)
    t[ignore] = -100
    g1, g2 = torch.randn(n, generator=gen), torch.randn(n, generator=gen) if with_entropy else None
    blocks = dict(block_n=16, block_v=16, block_h=16)
    want = chunked.chunked_forward(x, w, b, t, temperature, -100, with_entropy)
    if via_op:  # the functions the custom op calls, forced to a Triton implementation by name
        got = op._forward(x, w, b, t, temperature, -100, with_entropy, impl=via_op)
        grads = op._backward(g1, g2, x, w, b, t, got[2], got[1], temperature, -100, True, True, impl=via_op)
        got = (got[0], got[1] if with_entropy else None, got[2])
        grads = [g if g.numel() else None for g in grads]
    else:
        got = tri.triton_forward(x, w, b, t, temperature, -100, with_entropy, max_splits=splits, **blocks)
        grads = backward(g1, g2, x, w, b, t, got[2], got[1], temperature, -100, **blocks)
    want_grads = chunked.chunked_backward(g1, g2, x, w, b, t, want[2], want[1], temperature, -100)
    err = lambda a, c: None if a is None and c is None else float((a - c).abs().max())
    return dict(logp=err(got[0], want[0]), entropy=err(got[1], want[1]), lse=err(got[2], want[2]),
                dh=err(grads[0], want_grads[0]), dw=err(grads[1], want_grads[1]), db=err(grads[2], want_grads[2]),
                ignored=[float(got[0][i]) for i in ignore], ignored_dh=float(grads[0][ignore].abs().max()))

cases = dict(
    one_block=case(5, 8, 13, True, 1.0, True, [1], 1),
    partial_tiles=case(21, 24, 70, True, 0.7, True, [2, 20], 1),
    vocab_splits=case(21, 24, 70, False, 1.3, True, [0], 3),
    no_entropy=case(18, 16, 37, True, 1.0, False, [5], 2),
    via_op=case(9, 8, 41, True, 0.9, True, [3], 1, via_op="triton"),
    owned_one_block=case(5, 8, 13, True, 1.0, True, [1], 1, backward=own.triton_owned_backward),
    owned_partial_tiles=case(21, 24, 70, True, 0.7, True, [2, 20], 1, backward=own.triton_owned_backward),
    owned_no_bias=case(21, 24, 70, False, 1.3, True, [0], 3, backward=own.triton_owned_backward),
    owned_no_entropy=case(18, 16, 37, True, 1.0, False, [5], 2, backward=own.triton_owned_backward),
    owned_via_op=case(9, 8, 41, True, 0.9, True, [3], 1, via_op="triton_owned"),
)

def automatic():
    # The public op on 'auto': every Triton candidate timed beside the PyTorch ones; equal results.
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(7, 16, generator=gen, requires_grad=True), torch.randn(33, 16, generator=gen, requires_grad=True)
    t = torch.randint(0, 33, (7,), generator=gen)
    clear_choices()
    logp, ent = fused_logprobs(x, w, t, impl="auto")
    got = torch.autograd.grad(logp.sum() + ent.sum(), (x, w))
    ref_logp, ref_ent = fused_logprobs(x, w, t, impl="chunked")
    want = torch.autograd.grad(ref_logp.sum() + ref_ent.sum(), (x, w))
    # relative to the largest value: which candidate wins depends on the machine's load, and two
    # orders of fp32 sums differ by rounding that grows with the values (1.1e-5 absolute seen on
    # gradients of magnitude ~10 when a Triton backward won)
    errs = [float((a - c).abs().max()) / max(1.0, float(c.abs().max()))
            for a, c in zip((logp, ent, *got), (ref_logp, ref_ent, *want))]
    timed = {k.split()[0]: sorted(c.seconds) for k, c in choices().items()}
    return dict(errs=errs, timed=timed, names=list(implementations("cpu")))

import doctest
examples = [doctest.testmod(m, report=False) for m in (tri, own)]
print(json.dumps(dict(kernel_type=type(tri._forward_kernel).__name__, cases=cases, automatic=automatic(),
                      examples=[sum(e.attempted for e in examples), sum(e.failed for e in examples)])))
"""

TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernels_ran_in_the_interpreter(results):
    assert results["kernel_type"] == "InterpretedFunction"


def test_docstring_examples_run_in_the_interpreter(results):
    attempted, failed = results["examples"]
    assert attempted >= 7 and failed == 0


@pytest.mark.parametrize("name", ["one_block", "partial_tiles", "vocab_splits", "via_op", "owned_one_block",
                                  "owned_partial_tiles", "owned_no_bias", "owned_via_op"])
def test_forward_and_backward_equal_chunked(results, name):
    errs = results["cases"][name]
    for key in ("logp", "entropy", "lse", "dh", "dw"):
        assert errs[key] is not None and errs[key] < TOL, (key, errs)
    if name not in ("vocab_splits", "owned_no_bias"):  # the cases with a bias
        assert errs["db"] < TOL, errs


@pytest.mark.parametrize("name", ["no_entropy", "owned_no_entropy"])
def test_without_entropy(results, name):
    errs = results["cases"][name]
    assert errs["entropy"] is None  # not computed, not returned
    for key in ("logp", "lse", "dh", "dw", "db"):
        assert errs[key] < TOL, (key, errs)


def test_automatic_choice_times_the_triton_candidates_too(results):
    """Under the interpreter the Triton kernels count as usable on CPU: 'auto' times the three
    distinct forwards and all four backwards, and its result equals the forced chunked path (to
    TOL relative to the largest value: the winner, and so the order of the sums, varies)."""
    auto = results["automatic"]
    assert auto["names"] == ["chunked", "full_vocab", "triton", "triton_owned"]
    assert auto["timed"] == {"forward": ["chunked", "full_vocab", "triton"],
                             "backward": ["chunked", "full_vocab", "triton", "triton_owned"]}
    assert max(auto["errs"]) < TOL, auto["errs"]


@pytest.mark.parametrize("name", ["one_block", "partial_tiles", "no_entropy", "owned_partial_tiles"])
def test_ignored_positions_are_zero(results, name):
    errs = results["cases"][name]
    assert errs["ignored"] == [0.0] * len(errs["ignored"])
    assert errs["ignored_dh"] == 0.0
