"""ESSScaledLR (VCPO): the callback against values computed by hand from its formula (cited in its docstring
and docs/callbacks.md), on its pure controller and inside a tiny fit."""
import math

import pytest
import torch

from callback_helpers import Spy, fit, make_module
from lightning_rlpt.algorithms.advantages import compute_advantages
from lightning_rlpt.callbacks import ESSScaledLR


def test_ess_scales_the_lr_of_the_step_and_restores_it(warm_start_dir, arithmetic_rows):
    events = []

    def check(hook, trainer, module, x):
        if hook == "loss":
            m = x.completion_mask.double()
            w = torch.exp(((x.old_logprobs.double() - x.behaviour_logprobs.double()) * m).sum(1))
            rho = float(w.sum() ** 2 / ((w ** 2).sum() + 1e-8)) / len(w)
            events.append(("expect", math.sqrt(min(1.0, rho)), rho))
        if hook == "optimizer":
            events.append(("lr", x.param_groups[0]["lr"], None))

    module = make_module(warm_start_dir, engine="off_policy", lr=1e-3)
    trainer = fit(module, [ESSScaledLR(), Spy(check)], arithmetic_rows[:8], steps=2)
    pairs = list(zip(events[::2], events[1::2]))
    assert len(pairs) == 2
    for (_, factor, rho), (_, lr, _) in pairs:
        assert rho < 0.99 and lr == pytest.approx(1e-3 * factor, rel=1e-9)
    assert trainer.optimizers[0].param_groups[0]["lr"] == 1e-3  # restored after the step


def test_ess_leaves_the_lr_unchanged_on_policy(warm_start_dir, arithmetic_rows):
    lrs = []
    module = make_module(warm_start_dir, engine="on_policy", lr=1e-3)
    fit(module, [ESSScaledLR(rule="linear"), Spy(lambda h, t, m, x: h == "optimizer" and lrs.append(x.param_groups[0]["lr"]))],
        arithmetic_rows[:8], steps=2)
    assert lrs == [1e-3, 1e-3]


def test_min_variance_baseline_by_hand():
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    w = torch.tensor([2.0, 1.0, 0.5, 1.0])
    g = torch.tensor([1.0, 2.0, 1.0, 1.0])
    big_w = [1 * 4, 2 * 1, 1 * 0.25, 1 * 1]
    b = (4 * 1 + 0 + 0.25 * 1 + 0) / (sum(big_w) + 1e-8)
    got = compute_advantages("min_variance_offpolicy", r.view(-1), 4, is_weights=w, grad_sq_norms=g)
    assert got.tolist() == pytest.approx([1 - b, -b, 1 - b, -b])
    assert compute_advantages("min_variance_offpolicy", r.view(-1), 4).tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])


def test_the_former_baseline_option_is_refused_naming_the_estimator():
    # ESSScaledLR no longer overwrites the advantages: ignoring baseline= would silently train with another one
    with pytest.raises(ValueError, match=r"no longer replaces the advantages.*RLModule\(advantage="
                                         r"'min_variance_offpolicy'\)"):
        ESSScaledLR(baseline="min_variance")
    with pytest.raises(ValueError, match=r"advantage_kwargs=\{'grad_norm_proxy': 'length'\}"):
        ESSScaledLR(baseline="min_variance", grad_norm_proxy="length")
    assert not hasattr(ESSScaledLR, "on_advantages_computed") or \
        ESSScaledLR.on_advantages_computed is ESSScaledLR.__mro__[1].on_advantages_computed
