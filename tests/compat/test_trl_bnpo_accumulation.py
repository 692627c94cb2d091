"""``loss_type="bnpo"`` with gradient accumulation: TRL (``GRPOTrainer._compute_loss``) divides each
micro-batch by its own token count and averages the micro-batches; here the step is divided by the
rank's tokens over all micro-batches. The converter says so when the two can differ."""
import warnings

import pytest

from lightning_rlpt.compat.trl import from_grpo_config


def test_bnpo_with_accumulation_warns_what_differs():
    with pytest.warns(UserWarning, match=r"loss_type='bnpo' with gradient_accumulation_steps=4: here bnpo divides "
                                         r"the optimizer step's loss by the rank's token count over all 4 "
                                         r"micro-batches.*TRL divides each micro-batch by its own token count.*"
                                         r"use gradient_accumulation_steps=1"):
        args = from_grpo_config({"loss_type": "bnpo", "gradient_accumulation_steps": 4})
    assert args.module["loss_aggregation"] == "bnpo"


@pytest.mark.parametrize("fields", [dict(loss_type="bnpo"), dict(loss_type="dapo", gradient_accumulation_steps=4)])
def test_no_warning_where_they_agree(fields):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_grpo_config(fields)
