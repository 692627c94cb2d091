"""VESPO's train/inference factor is truncated per token before the sequence product, as TRL
feeds ``GRPOTrainer.get_gamma_weights`` the token-truncated ratio (``token_truncate``, cap 3)."""
import math

import pytest
import torch

from lightning_rlpt import POLICY_LOSSES

F64 = torch.float64


def phi(behaviour_cap="default"):
    """Two rows (A = 1: k, λ = 2, 3; A = −1: k, λ = 3, 2), π = π_old, and π_old/π_behav = (4, 0.5)."""
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=F64))
    behav = torch.log(torch.tensor([[0.125, 1.0], [0.125, 1.0]], dtype=F64))
    kwargs = {} if behaviour_cap == "default" else {"behaviour_cap": behaviour_cap}
    _, stats = POLICY_LOSSES.get("vespo")(logp, logp.clone(), torch.tensor([1.0, -1.0], dtype=F64),
                                          torch.ones(2, 2, dtype=F64), behaviour_logprobs=behav, **kwargs)
    return stats["vespo/phi_seq"].tolist()


def test_the_behaviour_ratio_is_truncated_per_token_at_three_by_default():
    """Truncated: w = min(4, 3)·0.5 = 1.5 → φ = e^3·1.5²·e^{−4.5} = 2.25·e^{−1.5} = 0.502043 (A = 1)
    and e^2·1.5³·e^{−3} = 3.375·e^{−1} = 1.241593 (A = −1). Untruncated w = 4·0.5 = 2 would give
    4·e^{−3} = 0.199148 and 8·e^{−2} = 1.082682."""
    assert phi() == pytest.approx([2.25 * math.exp(-1.5), 3.375 * math.exp(-1)], abs=1e-12)
    assert phi() == pytest.approx([0.502043, 1.241593], abs=1e-6)
    assert phi(None) == pytest.approx([4 * math.exp(-3), 8 * math.exp(-2)], abs=1e-12)  # None: no truncation
    assert phi(5.0) == phi(None)  # a cap above every token's ratio changes nothing


def test_a_bad_cap_is_refused():
    with pytest.raises(ValueError, match=r"vespo's behaviour_cap must be > 0 or None \(got 0\.0\); TRL's default is 3.0"):
        phi(0.0)


def test_rows_the_kernel_drops_are_counted():
    """Row 0: five tokens with π_old/π_behav = e^4, truncated to 3 each: w = 3^5 = 243, φ = e^3·243²·e^{−729}
    = 0 in float64; row 1: w = 1, φ = 1. ``vespo/phi_vanished`` is 1 on row 0's tokens only."""
    logp = torch.full((2, 5), -1.0, dtype=F64)
    behav = logp.clone()
    behav[0] -= 4.0
    _, stats = POLICY_LOSSES.get("vespo")(logp, logp.clone(), torch.tensor([1.0, 1.0], dtype=F64),
                                          torch.ones(2, 5, dtype=F64), behaviour_logprobs=behav)
    assert stats["vespo/phi_seq"].tolist() == pytest.approx([0.0, 1.0], abs=1e-300)
    assert stats["vespo/phi_vanished"].tolist() == [[1.0] * 5, [0.0] * 5]
