"""The frozen reference of a full fine-tune, optionally lean: its dtype, and where it waits.

Full fine-tuning keeps a frozen copy of the starting policy for the KL term: a second model
in memory. Two `RLModule` options make it cheaper (the names follow verl's
``ref.fsdp_config.model_dtype`` / ``param_offload`` and OpenRLHF's ``--ref_reward_offload``):

- ``reference_dtype="bfloat16"``: the copy is stored in bf16, half the bytes of an fp32 copy
  (verl loads its reference in bf16 by default). Its forward computes in bf16; the
  log-softmax still runs in fp32 (`model.logprobs`). The reference log-probs then differ from
  an fp32 reference's by bf16 rounding, which puts a floor under the measured KL.
- ``reference_offload=True``: the copy's weights stay in CPU memory and move to the policy's
  device only for the reference's no-grad forward, then back ("on-demand transfer"). It saves
  one model's worth of *accelerator* memory for two host-device copies per training batch. On
  a CPU-only run the moves are no-ops.

Under LoRA/QLoRA the reference is the base model with the adapters disabled: there is no
copy, so both options are refused (`check_reference_options`).

Examples:
    >>> ref = build_reference(policy, wanted=True, dtype="bfloat16", offload=True)  # doctest: +SKIP
    >>> with onloaded(ref, torch.device("cuda")):  # doctest: +SKIP
    ...     logits = ref(input_ids).logits
"""
from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .loading import is_peft

REFERENCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_OFFLOAD = "_rlpt_reference_offload"  # set on the frozen copy itself, so it travels with it


def check_reference_options(dtype: Any, offload: bool, lora: Any) -> torch.dtype | None:
    """The reference dtype as a ``torch.dtype`` (None: the policy's); refuses the options under
    LoRA/QLoRA before any model is loaded."""
    if (dtype is not None or offload) and lora is not None:
        raise ValueError("reference_dtype / reference_offload shape the frozen copy of a full fine-tune; under "
                         "LoRA/QLoRA the reference is the base model with the adapters disabled, so there is no "
                         "copy to shrink or offload: drop these options (the base already is the reference)")
    if dtype is None or dtype in REFERENCE_DTYPES.values():
        return dtype
    name = str(dtype).replace("torch.", "")
    if name not in REFERENCE_DTYPES:
        raise ValueError(f"reference_dtype must be one of {', '.join(REFERENCE_DTYPES)} or None (the policy's "
                         f"dtype); got {dtype!r}")
    return REFERENCE_DTYPES[name]


def build_reference(policy: nn.Module, wanted: bool, dtype: Any = None, offload: bool = False) -> nn.Module | None:
    """The frozen reference of a full fine-tune, or None: no KL reference wanted, or a peft
    policy (LoRA/QLoRA: `loading.reference_context` disables the adapters instead)."""
    dtype = check_reference_options(dtype, offload, "peft" if is_peft(policy) else None)
    if not wanted:
        if dtype is not None or offload:
            warnings.warn("reference_dtype / reference_offload have no effect: this run builds no reference "
                          "(kl_coef=0 and reference not forced on)", stacklevel=3)
        return None
    return None if is_peft(policy) else frozen_copy(policy, dtype, offload)


def frozen_copy(policy: nn.Module, dtype: torch.dtype | None = None, offload: bool = False) -> nn.Module:
    """A frozen copy of ``policy`` (in its mode: `loading.reference_context` runs it in eval mode
    when dropout is on), its parameters in ``dtype`` and, with ``offload``, in CPU memory.

    The parameters are cast while they are copied, so an fp32 copy never exists beside the
    policy. Buffers (e.g. rotary frequencies) keep their dtype, as ``from_pretrained(dtype=...)``
    leaves them.
    """
    memo: dict[int, Any] = {}
    if dtype is not None or offload:
        device = torch.device("cpu") if offload else None
        memo = {id(p): nn.Parameter(p.detach().to(device=device, dtype=dtype, copy=True), requires_grad=False)
                for p in policy.parameters()}
    ref = copy.deepcopy(policy, memo)
    for p in ref.parameters():
        p.requires_grad_(False)
    if offload:
        ref.to("cpu")
        setattr(ref, _OFFLOAD, True)
    return ref


def is_offloaded(model: nn.Module | None) -> bool:
    return bool(getattr(model, _OFFLOAD, False))


def park_offloaded(model: nn.Module | None) -> None:
    """Put an offloaded reference back in CPU memory (Lightning moved the whole module to the
    accelerator when the strategy set up); anything else stays where it is."""
    if is_offloaded(model):
        model.to("cpu")


@contextmanager
def onloaded(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """Run an offloaded reference on ``device`` for the block, then back to CPU memory (on a CPU
    run both moves are no-ops); any other model (the policy under LoRA, a reference kept on its
    device) is left alone."""
    if not is_offloaded(model):
        yield model
        return
    model.to(device)
    try:
        yield model
    finally:
        model.to("cpu")
