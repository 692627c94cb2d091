"""pass@k as validation logs it: the unbiased estimator against hand-computed values, and the
settings that would make it mean something else refused or warned about."""
import warnings

import pytest

from lightning_rlpt.metrics import pass_at_k, pass_at_k_metrics


def test_the_estimator_against_hand_computed_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)/C(4,2) of drawing two wrong ones
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 3, 2) == 1.0


def test_greedy_validation_with_several_samples_warns_that_pass_at_n_is_pass_at_1():
    with pytest.warns(UserWarning, match=r"val_samples=4 with greedy validation .* pass@4 equals pass@1"):
        assert sorted(pass_at_k_metrics(None, 4, temperature=0.0)) == ["1", "4"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pass_at_k_metrics(None, 4, temperature=0.8)  # sampled: the n completions differ
        pass_at_k_metrics(None, 1, temperature=0.0)  # one greedy completion: pass@1 is what it is
        pass_at_k_metrics([1], 4, temperature=0.0)  # only pass@1 asked for: repeats change nothing
    with pytest.raises(ValueError, match="more samples than val_samples=2"):
        pass_at_k_metrics([4], 2, temperature=0.8)
