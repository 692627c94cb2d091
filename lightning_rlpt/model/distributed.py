"""Data-parallel layouts: FSDP2 sharding for Lightning's ``ModelParallelStrategy``.

DDP needs nothing here: Lightning prepares DDP's reducer before every ``manual_backward``, so
several optimizer steps per rollout are fine, and each rank rolls out its own prompts (whole
groups, so group statistics stay local and exact). Loss denominators are summed over ranks in
`RLModule.loss` with `reduce_over_ranks`, the one helper for sums and means over ranks.

FSDP2 (``fully_shard``) shards every decoder layer and then the whole policy over the mesh's
data-parallel dimension; the frozen reference of a full fine-tune is sharded the same way.
``transformers.generate`` then all-gathers layers forward by forward, and every rank must run
the same number of forwards, hence ``synced_gpus`` in `rollout.hf.HFGenerateEngine`, which also
runs ``generate`` as a root forward (`run_as_root_forward`): a peft policy's ``generate`` calls
the inner model, outside the root's hooks.
Log-probs run the decoder and then the (fused) LM head as a registered forward method of the
root unit (`run_as_root_forward`), not through the root's ``forward``.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

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
    return any(is_dtensor(p) for p in model.parameters())


def is_dtensor(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "DTensor"


# The name under which `run_as_root_forward` registers its forward method on a sharded root.
ROOT_FORWARD = "_rlpt_root_forward"


def run_as_root_forward(model: nn.Module, fn: Callable[[], Any]) -> Any:
    """``fn()`` run as a forward of the FSDP2 root unit ``model``.

    FSDP2 gathers the root unit's own parameters (embeddings, final norm, LM head: those no inner
    ``fully_shard`` unit holds) in the hooks around the root's ``forward`` only. Calling the decoder
    and the head directly would leave them sharded; and a head weight gathered by hand with
    ``full_tensor()`` sends its gradient to each rank's own shard unreduced (seen on two gloo
    ranks: each shard held its rank's gradient, not the average). FSDP2's public ``register_fsdp_forward_method`` wraps any method in the
    same pre-/post-forward hooks: the root's parameters are gathered while ``fn`` runs (the
    decoder's layers still gather their own), the post-forward hook registers the pre-backward
    hook on ``fn``'s outputs, and the root's post-backward reduce-scatters every gradient that
    reached the gathered parameters (the fused kernel's included). A no-op wrapper on a model
    whose root is not an FSDP2 unit.

    Args:
        model: the policy or reference, sharded by `shard_with_fsdp2` (or any ``fully_shard``ed root).
        fn: a function of no arguments that runs parts of ``model`` and returns tensors.
    """
    if ROOT_FORWARD not in vars(model):
        from torch.distributed.fsdp import register_fsdp_forward_method

        setattr(model, ROOT_FORWARD, _call)  # an instance attribute: the hooks are per module, not per class
        register_fsdp_forward_method(model, ROOT_FORWARD)
    return getattr(model, ROOT_FORWARD)(fn)


def _call(fn: Callable[[], Any]) -> Any:
    # FSDP2 hangs its pre-backward hook on the outputs, and an in-place op on a view output would
    # drop it (FSDP warns on every call): return copies of views (log-probs: [N, C], cheap).
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.clone() if t._is_view() else t, fn())


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def release_process_group() -> None:
    """Call at the end of a multi-process script, after ``trainer.fit`` returned and its objects
    went out of scope: collects the reference cycles that still hold the process group (FSDP2's
    DTensors), then destroys it. Left to interpreter finalization, torch 2.13's gloo aborts the
    process ("terminate called without an active exception", SIGABRT) in about one exit of a dozen,
    after all its work is done: a scheduler then reports the job as failed."""
    import gc

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
