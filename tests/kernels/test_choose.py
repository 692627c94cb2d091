"""Choosing the log-prob implementation on CPU with the CPU candidates (``chunked``, ``full_vocab``):
timed once per bucket and cached, forced by argument or environment variable, wrong names
refused; and a detached entropy reaching the backward as None (no arithmetic for its terms).

Tolerance between implementations: fp32, 1e-5 absolute on outputs, 1e-5 + 1e-4 relative on gradients.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_rlpt.kernels import IMPL_ENV, choices, chosen_implementation, clear_choices, fused_logprobs
from lightning_rlpt.kernels import implementations
from lightning_rlpt.kernels.choose import Choice, bucket, time_candidates


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(IMPL_ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    clear_choices()
    yield
    clear_choices()


def make(n, hidden_size=16, vocab=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden_size, generator=gen, requires_grad=True)
    w = torch.randn(vocab, hidden_size, generator=gen, requires_grad=True)
    return h, w, torch.randint(0, vocab, (n,), generator=gen)


def step(h, w, t, **kwargs):
    logp, ent = fused_logprobs(h, w, t, **kwargs)
    return (logp, ent, *torch.autograd.grad(logp.sum() + 0.5 * ent.sum(), (h, w)))


def assert_same(got, want):
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


def test_implementations_per_device():
    assert implementations("cpu") == ("chunked", "full_vocab")
    assert implementations(torch.device("cuda", 1)) == ("chunked", "full_vocab", "triton", "triton_owned")
    assert implementations("cuda", torch.float64) == ("chunked", "full_vocab")  # no fast fp64 tl.dot


@pytest.mark.parametrize("n, want", [(0, 1), (1, 1), (2, 2), (3, 4), (1024, 1024), (1025, 2048)])
def test_bucket_rounds_tokens_up_to_a_power_of_two(n, want):
    assert bucket(n) == want


def test_auto_times_each_candidate_once_per_bucket_and_caches():
    h, w, t = make(13)
    step(h, w, t, impl="auto")
    first = choices()
    assert sorted(k.split()[0] for k in first) == ["backward", "forward"]
    for choice in first.values():  # both candidates timed; the fastest kept
        assert set(choice.seconds) == {"chunked", "full_vocab"} and not choice.failed
        assert choice.name == min(choice.seconds, key=choice.seconds.get)
    assert chosen_implementation(h, w) == first[next(k for k in first if k.startswith("forward"))].name
    assert chosen_implementation(h, w, backward=True, with_entropy=True) is not None

    h2, w2, t2 = make(11, seed=1)  # 11 tokens: the same bucket (<= 16) -> cache hit, no new timing
    step(h2, w2, t2, impl="auto")
    again = choices()
    assert again.keys() == first.keys() and all(again[k] is first[k] for k in first)

    h3, w3, t3 = make(40, seed=2)  # another bucket (<= 64): timed again
    step(h3, w3, t3, impl="auto")
    assert len(choices()) == 4 and chosen_implementation(h3, w3) is not None


def test_auto_equals_each_forced_implementation():
    h, w, t = make(13)
    auto = step(h, w, t, impl="auto")
    for name in implementations("cpu"):
        assert_same(step(h, w, t, impl=name), auto)


def test_forced_by_argument_or_cpu_default_times_nothing():
    h, w, t = make(13)
    step(h, w, t, impl="full_vocab")
    step(h, w, t)  # CPU default: chunked, reproducible run to run
    assert choices() == {}


def test_environment_variable_forces_and_the_argument_wins(monkeypatch):
    h, w, t = make(13)
    monkeypatch.setenv(IMPL_ENV, "auto")  # read at call time: this CPU call times
    step(h, w, t)
    assert len(choices()) == 2
    clear_choices()
    monkeypatch.setenv(IMPL_ENV, "full_vocab")
    assert_same(step(h, w, t), step(h, w, t, impl="chunked"))
    assert choices() == {}
    monkeypatch.setenv(IMPL_ENV, "no_such_kernel")
    with pytest.raises(ValueError, match=rf"{IMPL_ENV}='no_such_kernel' is not an implementation usable on cpu"):
        step(h, w, t)
    step(h, w, t, impl="chunked")  # the argument wins over the variable


@pytest.mark.parametrize("impl", ["triton", "triton_owned", "nope", ""])
def test_wrong_name_is_refused_with_the_valid_ones(impl):
    h, w, t = make(4)
    with pytest.raises(ValueError, match=r"impl='.*' is not an implementation usable on cpu .* "
                                         r"Use one of 'chunked', 'full_vocab', or 'auto'"):
        fused_logprobs(h, w, t, impl=impl)


def test_a_failing_candidate_is_skipped_and_recorded():
    def call(name):
        if name == "broken":
            raise RuntimeError("CUDA out of memory")
        return name.upper()

    with pytest.warns(RuntimeWarning, match="'broken' failed while being timed"):
        choice, out = time_candidates(("broken", "fine"), call, torch.device("cpu"))
    assert isinstance(choice, Choice) and choice.name == "fine" and out == "FINE"
    assert list(choice.seconds) == ["fine"] and "out of memory" in choice.failed["broken"]
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="no implementation could run"):
        time_candidates(("broken",), call, torch.device("cpu"))


class _BackwardCalls(TorchDispatchMode):
    """Records the upstream entropy gradient each call of the backward op receives."""

    def __init__(self):
        super().__init__()
        self.grad_entropy = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.lightning_rlpt.fused_logprobs_bwd.default:
            self.grad_entropy.append(args[1])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("impl", ["chunked", "full_vocab"])
def test_detached_entropy_reaches_the_backward_as_none(impl):
    """RLModule's training step: gradients through the log-probs, the entropy a detached metric.
    Autograd must not materialise a zero entropy gradient (whose terms would cost a full
    elementwise pass per tile); the gradients still equal the naive path's."""
    h, w, t = make(13)
    logp, ent = fused_logprobs(h, w, t, impl=impl)
    ent.detach()
    with _BackwardCalls() as calls:
        got = torch.autograd.grad(logp.sum(), (h, w))
    assert calls.grad_entropy == [None]
    ref = torch.log_softmax(h @ w.T, -1).gather(1, t[:, None]).sum()
    assert_same(got, torch.autograd.grad(ref, (h, w)))
    logp, ent = fused_logprobs(h, w, t, impl=impl)
    with _BackwardCalls() as calls:  # an entropy that carries gradient still gets it
        torch.autograd.grad(logp.sum() + ent.sum(), (h, w))
    assert calls.grad_entropy[0] is not None
