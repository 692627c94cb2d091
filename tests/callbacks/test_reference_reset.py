"""ReferenceReset (REVA-PO VAPR, TR-DPO syncs): the callback against values computed by hand from its
formula (cited in its docstring and docs/callbacks.md), on its pure controller and inside a tiny
fit."""

import pytest
import torch

from callback_helpers import Spy, fit, make_module
from lightning_rlpt.callbacks import ReferenceReset


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_soft_and_hard_reference_updates(lora, warm_start_dir, arithmetic_rows):
    from lightning_rlpt.model.loading import reference_context, reference_pairs

    settings = {"lora": dict(r=4, lora_alpha=8)} if lora else {}
    module = make_module(warm_start_dir, **settings)
    reset = ReferenceReset(mode="soft", alpha=0.25, every_n_steps=2)
    snap = {}

    def record(hook, trainer, m, x):
        if hook == "rewards" and trainer.global_step == 0:
            snap["ref0"] = [r.detach().clone() for _, r in reference_pairs(m.policy, m.reference)]

    fit(module, [Spy(record), reset], arithmetic_rows[:8], steps=2)
    pairs = reference_pairs(module.policy, module.reference)
    assert len(pairs) > 0 and reset.syncs == 1
    for (theta, ref), ref0 in zip(pairs, snap["ref0"]):
        assert torch.allclose(ref, 0.25 * theta + 0.75 * ref0, atol=1e-6)
    hard = ReferenceReset(mode="hard", every_n_steps=1)
    fit(module, [hard], arithmetic_rows[:8], steps=1)
    exp_ids = torch.tensor([[1, 5, 6, 13, 7, 8, 14, 9]])
    with torch.no_grad(), reference_context(module.policy, module.reference) as ref:
        ref_logits = ref(exp_ids).logits
    assert torch.allclose(ref_logits, module.policy(exp_ids).logits, atol=1e-5)


def test_vapr_loads_the_best_validation_policy_into_policy_and_reference(warm_start_dir, arithmetic_rows, held_out_rows):
    from lightning_rlpt.model.loading import reference_pairs

    module = make_module(warm_start_dir)
    reset = ReferenceReset(mode="best", every_n_validations=2)
    scores = []
    trainer = fit(module, [reset, Spy(lambda *a: None)], arithmetic_rows[:8], steps=2, val_rows=held_out_rows[:4],
                  val_check_interval=1, check_val_every_n_epoch=None)
    assert reset.validations == 2 and reset.resets == 1
    for name, p in module.policy.named_parameters():
        assert torch.equal(p.detach(), reset.best_weights[name])
    assert all(torch.equal(t, r) for t, r in reference_pairs(module.policy, module.reference))
    assert len(trainer.optimizers[0].state) == 0  # cleared at the reset
    del scores
