"""Counting the forwards of a decoder layer that build a graph: one per micro-batch, two with
gradient checkpointing (the forward, then its recompute during backward). Shared by
tests/model/test_gradient_checkpointing.py and tests/scripts/distributed_fit.py."""
from __future__ import annotations

import torch
from torch import nn

from lightning_rlpt.model.distributed import decoder_layers


def count_grad_forwards(policy: nn.Module) -> list[int]:
    """A one-element list that counts the grad-enabled calls of ``policy``'s first decoder layer.

    A forward *pre*-hook, not a forward hook: the non-reentrant recompute stops as soon as it has
    rebuilt the tensors backward needs, before the layer returns, so a forward hook never sees it.
    No-grad forwards (generation, reference and old log-probs) are not counted.
    """
    count = [0]

    def hook(layer: nn.Module, args: tuple) -> None:
        if torch.is_grad_enabled():
            count[0] += 1

    decoder_layers(policy)[0].register_forward_pre_hook(hook)
    return count
