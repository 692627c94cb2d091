"""ResponseWeightedKL (REVA-PO RER): the callback against values computed by hand from its formula
(cited in its docstring and docs/callbacks.md), on its pure controller and inside a tiny fit."""

import pytest

from callback_helpers import Spy, fit, make_module
from lightning_rlpt.callbacks import ResponseWeightedKL


def test_rer_weights_match_the_formula(warm_start_dir, arithmetic_rows):
    checked = []

    def check(hook, trainer, module, exp):
        if hook != "advantages":
            return
        mask = exp.completion_mask.float()
        h = (exp.info["ref_entropy"] * mask).sum(1) / mask.sum(1)
        for i in range(len(exp)):
            grp = h[(i // 4) * 4:(i // 4) * 4 + 4]
            x = float((h[i] - grp.min()) / (grp.max() - grp.min() + 1e-6))
            a = float(exp.advantages[i])
            beta = 0.05 + 0.05 * (1 - x) if a > 0 else 0.10 + 0.02 * x if a < 0 else 0.10
            assert float(exp.kl_weights[i]) * 0.10 == pytest.approx(max(beta, 0.0), abs=1e-6)
        checked.append(len(exp))

    module = make_module(warm_start_dir)
    fit(module, [ResponseWeightedKL(), Spy(check)], arithmetic_rows[:8], steps=2)
    assert module.requests.ref_entropy and checked == [16, 16]
