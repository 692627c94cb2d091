"""The high-entropy token mask (Wang et al., arXiv 2506.01939; TRL's ``top_entropy_quantile``):
thresholds and masks computed by hand; padding never counts; the quantile equals torch's."""
import pytest
import torch

from lightning_rlpt.algorithms.entropy_mask import (check_top_entropy_quantile, entropy_threshold, high_entropy_mask,
                                                    quantile)

# Two rows; the last two columns of row 1 are padding with a (spurious) huge entropy.
ENTROPY = torch.tensor([[0.1, 0.5, 0.9, 0.3],
                        [0.7, 0.2, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 1],
                     [1, 1, 0, 0]])


def test_threshold_and_mask_by_hand():
    # Trained entropies sorted: 0.1 0.2 0.3 0.5 0.7 0.9 (n = 6).
    # rho = 0.5: the 0.5 quantile sits at position 0.5 * 5 = 2.5, halfway 0.3 → 0.5: 0.4.
    t = entropy_threshold(ENTROPY, MASK, 0.5)
    assert t.item() == pytest.approx(0.4)
    assert high_entropy_mask(ENTROPY, MASK, t).tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    # rho = 0.2: the 0.8 quantile at position 4.0 is 0.7 exactly, kept (>=): 0.7 and 0.9.
    t = entropy_threshold(ENTROPY, MASK, 0.2)
    assert t.item() == pytest.approx(0.7)
    assert high_entropy_mask(ENTROPY, MASK, t).tolist() == [[0, 0, 1, 0], [1, 0, 0, 0]]


def test_rho_one_keeps_every_trained_token_and_never_padding():
    t = entropy_threshold(ENTROPY, MASK, 1.0)
    assert t.item() == pytest.approx(0.1)  # the minimum
    assert torch.equal(high_entropy_mask(ENTROPY, MASK, t), MASK.float())


def test_masked_tokens_take_no_part_in_the_threshold():
    truncated = MASK.clone()
    truncated[1] = 0  # e.g. mask_truncated_completions: row 1 is out of the loss
    # 0.1 0.3 0.5 0.9: the 0.5 quantile at 1.5 → 0.4; row 1's 0.7 is not kept either.
    t = entropy_threshold(ENTROPY, truncated, 0.5)
    assert t.item() == pytest.approx(0.4)
    assert high_entropy_mask(ENTROPY, truncated, t).tolist() == [[0, 1, 1, 0], [0, 0, 0, 0]]


def test_gather_brings_in_the_other_ranks_tokens():
    other_rank = torch.tensor([2.0, 3.0])  # what an all-gather adds
    t = entropy_threshold(ENTROPY, MASK, 0.25, gather=lambda v: torch.cat([v, other_rank]))
    # 0.1 0.2 0.3 0.5 0.7 0.9 2 3: the 0.75 quantile at 5.25 → 0.9 + 0.25 * 1.1 = 1.175: none kept here.
    assert t.item() == pytest.approx(1.175)
    assert high_entropy_mask(ENTROPY, MASK, t).sum().item() == 0


def test_no_trained_token_keeps_nothing():
    t = entropy_threshold(ENTROPY, torch.zeros_like(MASK), 0.2)
    assert t.item() == float("inf")
    assert high_entropy_mask(ENTROPY, torch.zeros_like(MASK), t).sum().item() == 0


@pytest.mark.parametrize("q", [0.0, 0.13, 0.5, 0.8, 0.999, 1.0])
def test_quantile_equals_torch_quantile(q):
    values = torch.rand(1001, generator=torch.Generator().manual_seed(0))
    assert quantile(values, q).item() == pytest.approx(torch.quantile(values, q).item(), abs=1e-7)


def test_the_mask_carries_no_gradient():
    entropy = ENTROPY.clone().requires_grad_()
    assert not high_entropy_mask(entropy, MASK, 0.4).requires_grad


@pytest.mark.parametrize("rho", [0, 0.0, -0.2, 1.5, True, "0.2"])
def test_bad_quantiles_are_refused(rho):
    with pytest.raises(ValueError, match=r"top_entropy_quantile must be in \(0, 1\].*1.0 trains on every token, "
                                         r"the paper uses 0.2"):
        check_top_entropy_quantile(rho)


def test_docstring_examples_hold():
    import doctest

    from lightning_rlpt.algorithms import entropy_mask

    assert doctest.testmod(entropy_mask).failed == 0
