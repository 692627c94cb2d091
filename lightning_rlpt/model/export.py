"""A Lightning checkpoint of an `RLModule` out as a Hugging Face model directory.

The checkpoint says how the policy was built: ``model_name_or_path`` and ``lora_config`` (saved
by ``RLModule.on_save_checkpoint``) and the hyper-parameters ``quantization``, ``torch_dtype``,
``seed``.
`export_checkpoint` rebuilds that policy from the base, checks that the checkpoint's ``policy.*``
tensors fit it name by name and shape by shape, loads them, and only then writes:

- **full fine-tuning**: the trained model and the base's tokenizer;
- **LoRA, merged** (default): a plain model whose weights are ``W + scale · B A``, computed by
  `model.weights.policy_weights` (the tensors vLLM is synced with during training), so it loads
  anywhere without peft;
- **LoRA, adapter only**: peft's ``save_pretrained`` (``adapter_config.json`` +
  ``adapter_model.safetensors``) with ``base_model_name_or_path`` set to the base;
- **QLoRA, merged**: the 4-bit base is *dequantised* (the exact values the 4-bit layers multiplied
  with in training) and the adapter added, in the training compute dtype (``torch_dtype``,
  float32 by default). The result is dense and computes what the trained QLoRA policy computed;
  it is not the full-precision base plus the adapter, and it is not re-quantised (re-quantising
  would round the merged weights again). **QLoRA, adapter only**: the adapter alone; load it on
  the base quantised the same way (``quantization`` in the checkpoint's hyper-parameters) to
  reproduce the trained policy.

The directory is written atomically: into a temp directory beside ``out_dir``, each file fsynced,
then renamed to ``out_dir`` (`checkpoint_io.atomic_directory`); a killed export's temp is removed
by the next export beside it.

Only load checkpoints you trust: Lightning checkpoints are pickles (``torch.load`` with
``weights_only=False``, as the hyper-parameters may hold Python objects).

Examples:
    >>> export_checkpoint("runs/x/checkpoints/last.ckpt", "exported")  # doctest: +SKIP
    'exported'
    >>> AutoModelForCausalLM.from_pretrained("exported")  # doctest: +SKIP
"""
from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from ..checkpoint_io import atomic_directory, check_checkpoint_file
from .loading import REFERENCE_ADAPTER, add_reference_adapter, is_peft, load_policy, load_tokenizer
from .weights import policy_weights

PREFIX = "policy."  # RLModule keeps the trained model as ``self.policy``


def export_checkpoint(ckpt_path: str, out_dir: str, *, merge_lora: bool = True, model: str | None = None) -> str:
    """Write the policy of an `RLModule` checkpoint as a Hugging Face directory (model + tokenizer).

    Args:
        ckpt_path: a ``.ckpt`` file saved by Lightning while training an `RLModule`.
        out_dir: where to write; must not exist or be empty (mixing exports confuses loaders).
        merge_lora: LoRA/QLoRA checkpoints: merge the adapter into the base (True) or save the
            adapter alone with peft (False; an error for a full fine-tune, which has none).
        model: the base model (hub id or directory) to rebuild on, instead of the
            ``model_name_or_path`` recorded in the checkpoint (needed when it moved, was a relative
            path from another working directory, or the module was built from an ``nn.Module``).

    Returns ``out_dir``. Raises FileNotFoundError for a missing checkpoint, ValueError when the
    checkpoint does not fit the base (names or shapes differ), both before writing anything.

    Examples:
        >>> export_checkpoint("last.ckpt", "merged")  # doctest: +SKIP
        >>> export_checkpoint("last.ckpt", "adapter", merge_lora=False)  # doctest: +SKIP
    """
    check_out_dir(out_dir)
    ckpt = load_checkpoint(ckpt_path)
    hparams = recorded_build(ckpt)
    base = base_model_path(hparams, model, ckpt_path)
    policy = rebuild_policy(base, hparams, ckpt["state_dict"])
    if not merge_lora and not is_peft(policy):
        raise ValueError(f"{ckpt_path!r} is a full fine-tune: it has no LoRA adapter to save alone. "
                         "Export it without --adapter-only (merge_lora=True)")
    load_policy_state(policy, ckpt["state_dict"], base, ckpt_path)
    tokenizer = load_tokenizer(base, None)  # as training loaded it (EOS as pad when it has none)
    with atomic_directory(out_dir) as temp:  # a kill or a full disk leaves no half-written export under out_dir
        write_policy(policy, merge_lora, base, hparams, temp)
        tokenizer.save_pretrained(temp)
    return out_dir


def write_policy(policy: nn.Module, merge_lora: bool, base: str, hparams: dict[str, Any], out_dir: str) -> None:
    """The model files: the full model, the merged LoRA model, or the adapter alone."""
    if not is_peft(policy):
        policy.save_pretrained(out_dir)
    elif merge_lora:
        merged_model(policy, base, hparams).save_pretrained(out_dir)
    else:
        policy.peft_config[policy.active_adapter].base_model_name_or_path = _portable(base)
        policy.save_pretrained(out_dir, selected_adapters=[policy.active_adapter])  # not ReferenceReset's


def load_checkpoint(ckpt_path: str) -> dict[str, Any]:
    """The checkpoint dict, checked to come from an `RLModule`."""
    if not os.path.exists(ckpt_path):
        raise FileNotFoundError(f"no checkpoint at {ckpt_path!r}: pass the .ckpt file written by ModelCheckpoint "
                                "(e.g. <log_dir>/checkpoints/epoch=0-step=200.ckpt)")
    if os.path.isdir(ckpt_path):
        raise ValueError(f"{ckpt_path!r} is a directory (a sharded checkpoint, e.g. from FSDP2?): export reads "
                         "single-file checkpoints. Convert it to one file first (Lightning ships "
                         "`python -m lightning.fabric.utilities.consolidate_checkpoint DIR` for FSDP checkpoints)")
    check_checkpoint_file(ckpt_path)  # empty, torn or corrupted: refused naming the part and the previous one
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or "model_name_or_path" not in recorded_build(ckpt) or "state_dict" not in ckpt:
        raise ValueError(f"{ckpt_path!r} is not an RLModule checkpoint (no recorded 'model_name_or_path' or no "
                         "state_dict): export a .ckpt saved by Lightning while training an RLModule")
    return ckpt


def recorded_build(ckpt: dict[str, Any]) -> dict[str, Any]:
    """How the policy was built: the hyper-parameters plus the base path and LoRA config that
    `RLModule` saves under ``checkpoint["lightning_rlpt"]["model_source"]`` (checkpoints from
    before that kept them among the hyper-parameters, which still works)."""
    source = (ckpt.get("lightning_rlpt") or {}).get("model_source") or {}
    return {**(ckpt.get("hyper_parameters") or {}), **source}


def base_model_path(hparams: dict[str, Any], model: str | None, ckpt_path: str) -> str:
    """The base to rebuild on: ``model`` when given, else the one recorded at training."""
    base = model or hparams.get("model_name_or_path")
    if base is None:
        raise ValueError(f"{ckpt_path!r} was trained on a model given as an nn.Module, so it records no base path: "
                         "save that model with save_pretrained(dir) and pass model=dir (--model dir)")
    return str(base)


def check_out_dir(out_dir: str) -> None:
    """Refuse to write into a used directory (checked first: loading may take long)."""
    if os.path.isfile(out_dir) or (os.path.isdir(out_dir) and os.listdir(out_dir)):
        raise FileExistsError(f"{out_dir!r} exists and is not an empty directory: choose a new directory or empty "
                              "it (a merged model and an adapter in one directory confuse from_pretrained)")


def rebuild_policy(base: str, hparams: dict[str, Any], state_dict: dict[str, torch.Tensor]) -> nn.Module:
    """The policy as training left it, with the base's weights: as `RLModule.__init__` built it,
    plus the ``reference`` adapter that `ReferenceReset` adds under LoRA when the checkpoint has one."""
    try:
        policy = load_policy(base, lora=hparams.get("lora_config"), quantization=hparams.get("quantization"),
                             torch_dtype=hparams.get("torch_dtype"), seed=hparams.get("seed", 0))
    except OSError as err:  # a moved directory, a path relative to another working directory, no hub access
        raise FileNotFoundError(f"cannot load the base model {base!r} (working directory {os.getcwd()}): "
                                f"{str(err).rstrip('.')}. Run from the training working directory or pass model= "
                                "(--model) with the base's location") from err
    if is_peft(policy) and any(f".{REFERENCE_ADAPTER}." in key for key in state_dict):
        add_reference_adapter(policy)  # exported is the active (trained) adapter, never this one
    return policy


def load_policy_state(policy: nn.Module, state_dict: dict[str, torch.Tensor], base: str, ckpt_path: str) -> None:
    """Load the checkpoint's ``policy.*`` tensors after checking names and shapes match."""
    saved = {k[len(PREFIX):]: v for k, v in state_dict.items() if k.startswith(PREFIX)}
    expected = {k: v.shape for k, v in policy.state_dict().items()}
    missing = sorted(set(expected) - set(saved))
    unexpected = sorted(set(saved) - set(expected))
    shapes = [f"{k}: checkpoint {tuple(saved[k].shape)} vs base {tuple(expected[k])}"
              for k in sorted(set(saved) & set(expected)) if saved[k].shape != expected[k]]
    if missing or unexpected or shapes:
        problems = [f"{len(missing)} missing (e.g. {missing[:3]})" if missing else "",
                    f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})" if unexpected else "",
                    f"{len(shapes)} of other shapes (e.g. {shapes[:3]})" if shapes else ""]
        raise ValueError(f"checkpoint {ckpt_path!r} does not fit the base model {base!r}: tensors "
                         f"{'; '.join(p for p in problems if p)}. It was trained on another model (or LoRA "
                         "config): pass the base it was trained from as model= (--model)")
    quantized = load_4bit_weights(policy, saved)
    missing, unexpected = policy.load_state_dict({k: v for k, v in saved.items() if k not in quantized}, strict=False)
    if set(missing) - quantized or unexpected:  # the check above should have caught any such key
        raise RuntimeError(f"loading {ckpt_path!r} left {sorted(set(missing) - quantized)[:3]} unset and "
                           f"{unexpected[:3]} unused")


def load_4bit_weights(policy: nn.Module, saved: dict[str, torch.Tensor]) -> set[str]:
    """QLoRA: install the checkpoint's 4-bit base weights (codes and quantisation state) as
    trained, instead of trusting that re-quantising the base here gives the same codes (another
    device or bitsandbytes version may round differently). Returns the keys it used."""
    used: set[str] = set()
    for name, module in policy.named_modules():
        weight = module._parameters.get("weight")  # not peft's `weight` property of the wrapping LoRA layer
        if type(weight).__name__ != "Params4bit":
            continue
        from bitsandbytes.nn import Params4bit

        key = f"{name}.weight"
        stats = {k: v for k, v in saved.items() if k.startswith(key + ".")}
        used |= {key, *stats}  # before the call: QuantState.from_dict pops entries from `stats`
        module.weight = Params4bit.from_prequantized(saved[key], stats, requires_grad=False, device=weight.device,
                                                     module=module)
    return used


def merged_model(policy: nn.Module, base: str, hparams: dict[str, Any]) -> nn.Module:
    """A plain (peft-free, dense) model holding the policy's merged weights."""
    from transformers import AutoModelForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(base, dtype=hparams.get("torch_dtype") or torch.float32)
    params = dict(dense.named_parameters())  # tied weights appear once, as in policy_weights
    with torch.no_grad():
        for name, tensor in policy_weights(policy, aliases=False):
            if name not in params:
                raise ValueError(f"merged weight {name!r} has no place in the base model {base!r}")
            params.pop(name).copy_(tensor)
    if params:
        raise ValueError(f"the merged policy gave no value for {sorted(params)[:3]} of {base!r}")
    return dense


def _portable(base: str) -> str:
    """An absolute path for a local base, so the adapter finds it from any directory."""
    return os.path.abspath(base) if os.path.isdir(base) else base
