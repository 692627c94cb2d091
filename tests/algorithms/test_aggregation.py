"""Loss aggregation modes by hand, and independence from how the batch is split."""
import pytest
import torch

from lightning_rlpt.algorithms.aggregation import aggregate_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [2.0, 2.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (1 + 2 + 3 + 4 + 2 + 2) / 6),
    ("seq-mean-token-sum", (6 + 4 + 4) / 3),
    ("seq-mean-token-mean", (2 + 4 + 2) / 3),
    ("seq-mean-token-sum-norm", (6 + 4 + 4) / (3 * 3)),
])
def test_modes_by_hand(mode, expected):
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_norm_length_is_the_constant():
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=10).item() == pytest.approx(14 / 30)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_global_denominators_make_shards_add_up(mode):
    """Two 'ranks' holding parts of the batch, with global counts, sum to the whole-batch loss."""
    whole = aggregate_loss(LOSS, MASK, mode, norm_length=3)
    tokens, seqs = MASK.sum().item(), 3
    parts = [aggregate_loss(LOSS[s], MASK[s], mode, num_tokens=tokens, num_seqs=seqs, norm_length=3)
             for s in (slice(0, 1), slice(1, 3))]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item())


def test_unknown_mode():
    with pytest.raises(ValueError, match="known: token-mean"):
        aggregate_loss(LOSS, MASK, "mean")
