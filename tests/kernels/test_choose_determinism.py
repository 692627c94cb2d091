"""The automatic choice under ``torch.use_deterministic_algorithms(True)``: a backward that adds
atomically is no candidate, the flag is part of the bucket, and forcing one raises (warns with
``warn_only``). On CPU ``triton`` is not available, so the atomic flag is put on ``full_vocab``
(the real entry is ``triton``, whose backward uses ``tl.atomic_add``)."""
from __future__ import annotations

import importlib
import threading
import time

import pytest
import torch

from lightning_rlpt.kernels import IMPL_ENV, choices, clear_choices, fused_logprobs

impl_module = importlib.import_module("lightning_rlpt.kernels.implementations")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(IMPL_ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(impl_module, "ATOMIC_BACKWARD", frozenset({"full_vocab"}))  # the fake atomic flag
    clear_choices()
    yield
    torch.use_deterministic_algorithms(False)
    clear_choices()


def step(n=13, seed=0, **kwargs):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, 16, generator=gen, requires_grad=True)
    w = torch.randn(37, 16, generator=gen, requires_grad=True)
    logp, ent = fused_logprobs(h, w, torch.randint(0, 37, (n,), generator=gen), **kwargs)
    return torch.autograd.grad(logp.sum() + ent.sum(), (h, w))


def timed(direction, deterministic):
    return [c for k, c in choices().items() if k.startswith(direction) and f"deterministic={deterministic}" in k]


def test_deterministic_runs_never_time_an_atomic_backward():
    step(impl="auto")  # not deterministic: both backwards are candidates
    assert [set(c.seconds) for c in timed("backward", False)] == [{"chunked", "full_vocab"}]
    torch.use_deterministic_algorithms(True)
    step(impl="auto")  # the same shapes, another bucket: timed again, without the atomic one
    (backward,) = timed("backward", True)
    assert set(backward.seconds) == {"chunked"} and backward.name == "chunked"
    (forward,) = timed("forward", True)
    assert set(forward.seconds) == {"chunked", "full_vocab"}  # forwards have no atomics: all candidates
    assert len(choices()) == 4


def test_forcing_an_atomic_backward_under_deterministic_algorithms_raises_or_warns():
    step(impl="full_vocab")  # not deterministic: fine
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=r"the 'full_vocab' backward adds into gradients atomically.*"
                                           r"Use impl='triton_owned'"):
        step(impl="full_vocab")
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match=r"the 'full_vocab' backward adds into gradients atomically"):
        step(impl="full_vocab")


def test_threads_time_a_bucket_once(monkeypatch):
    """Four threads reach a new bucket together: it is timed once per direction, not once per thread."""
    choose = importlib.import_module("lightning_rlpt.kernels.choose")
    real, timings = choose.time_candidates, []

    def counted(names, call, device):  # the real timing, counted and slowed to widen any race
        timings.append(names)
        time.sleep(0.2)
        return real(names, call, device)

    monkeypatch.setattr(choose, "time_candidates", counted)
    errors, start = [], threading.Barrier(4)

    def run(seed):
        try:
            start.wait()
            step(seed=seed, impl="auto")
        except Exception as err:  # noqa: BLE001 — reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(choices()) == 2 and len(timings) == 2  # one forward, one backward: once each
