"""A probe of transformers, not of the project (which does not pack): on CPU, several sequences
packed into one row, with ``position_ids`` restarting at 0 per sequence and *no* attention mask,
give each sequence its own logits and gradients under ``sdpa`` and ``eager`` attention, as long as
no KV cache is built (``use_cache=False``). transformers' masking_utils then finds the sequence
boundaries from the position ids (``find_packed_sequence_indices``) and builds a block-causal
mask; with the default ``use_cache=True`` a cache is created, the detection is skipped and the
sequences attend to each other. See docs/memory.md, "Padding-free packing"."""
import pytest
import torch

import tiny_task as task

LENGTHS = (5, 7, 4)
# fp32: the packed forward runs the same matmuls over a longer row (measured ≤ 2.4e-7 on the
# logits, ≤ 1.9e-6 on gradients of magnitude up to 6.4).
ATOL = 1e-5


def _model(attn: str):
    model = task.build_model(seed=1)
    model.set_attn_implementation(attn)
    return model


def _packed():
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 15, (n,), generator=gen) for n in LENGTHS]
    positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    return seqs, torch.cat(seqs)[None], positions


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_row_gives_each_sequence_its_own_logits_and_gradients(attn):
    model, (seqs, packed, positions) = _model(attn), _packed()
    model.train()
    alone = torch.cat([model(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
    alone.logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    together = model(input_ids=packed, position_ids=positions, use_cache=False).logits[0]
    together.logsumexp(-1).sum().backward()
    assert torch.allclose(together, alone, atol=ATOL), (together - alone).abs().max().item()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], atol=ATOL), name


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packing_is_ignored_when_a_kv_cache_is_built(attn):
    """The pitfall: ``use_cache`` defaults to True (also in train mode), and with a cache the
    boundaries are not looked for, so the later sequences see the earlier ones."""
    model, (seqs, packed, positions) = _model(attn), _packed()
    with torch.no_grad():
        alone = torch.cat([model(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
        cached = model(input_ids=packed, position_ids=positions).logits[0]
    first = LENGTHS[0]
    assert torch.allclose(cached[:first], alone[:first], atol=ATOL)  # the first sequence sees only itself
    assert (cached[first:] - alone[first:]).abs().max() > 0.1
