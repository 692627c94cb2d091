"""Data-parallel layouts: FSDP2 sharding for Lightning's ``ModelParallelStrategy``.

DDP needs nothing here: Lightning prepares DDP's reducer before every ``manual_backward``, so
several optimizer steps per rollout are fine, and each rank rolls out its own prompts (whole
groups, so group statistics stay local and exact). Loss denominators are summed over ranks in
`RLModule.loss` with `reduce_over_ranks`, the one helper for sums and means over ranks.

FSDP2 (``fully_shard``) shards every decoder layer and then the whole policy over the mesh's
data-parallel dimension; the frozen reference of a full fine-tune is sharded the same way.
``transformers.generate`` then all-gathers layers forward by forward, and every rank must run
the same number of forwards, hence ``synced_gpus`` in `rollout.hf.HFGenerateEngine`.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .reference import is_offloaded


def reduce_over_ranks(trainer: Any, values: Sequence[float], op: str = "sum") -> list[float]:
    """``values`` summed (``op="sum"``) or averaged (``"mean"``) over the data-parallel ranks, in
    float64; identity on one process or without a trainer."""
    t = torch.tensor(list(values), dtype=torch.float64)
    if trainer is not None and getattr(trainer, "world_size", 1) > 1:
        t = trainer.strategy.reduce(t.to(trainer.strategy.root_device), reduce_op=op).cpu()
    return t.tolist()


def is_model_parallel(trainer: Any) -> bool:
    from lightning.pytorch.strategies import ModelParallelStrategy

    return trainer is not None and isinstance(trainer.strategy, ModelParallelStrategy)


def shard_with_fsdp2(model: nn.Module, mesh: Any) -> None:
    """``fully_shard`` each decoder layer, then the root (FSDP2's recommended wrapping)."""
    from torch.distributed.fsdp import fully_shard

    if is_offloaded(model):
        raise ValueError("reference_offload=True is not supported under ModelParallelStrategy (FSDP2): each rank "
                         "already holds only its shard of the reference, and the strategy moves every shard to the "
                         "device. Drop reference_offload (reference_dtype='bfloat16' still halves the shards), or "
                         "train with DDP or on one device")
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard; "
                         "expected model.get_decoder().layers")
    return list(layers)


def is_sharded(model: nn.Module) -> bool:
    """FSDP2 turns parameters into DTensors."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
