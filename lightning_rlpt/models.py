"""Loading the policy (full, LoRA or QLoRA), its tokenizer and its reference."""
from __future__ import annotations

import copy
import importlib
import warnings
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from torch import nn

QUANTIZATIONS = ("nf4", "fp4")


def load_tokenizer(model: str | nn.Module, tokenizer: Any | None):
    from transformers import AutoTokenizer

    if tokenizer is None:
        if not isinstance(model, (str, bytes)) and not hasattr(model, "__fspath__"):
            raise ValueError("a model given as an nn.Module needs its tokenizer: RLModule(model, ..., tokenizer=tok)")
        tokenizer = AutoTokenizer.from_pretrained(str(model))
    elif isinstance(tokenizer, str):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token, so completions could never end; set tokenizer.eos_token")
    if tokenizer.pad_token_id is None:
        warnings.warn(f"the tokenizer has no pad token; using its EOS token {tokenizer.eos_token!r} for padding. "
                      "Set tokenizer.pad_token to silence this.", stacklevel=3)
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(model: str | nn.Module, *, lora: Any = None, quantization: str | None = None,
                torch_dtype: torch.dtype | str | None = None, gradient_checkpointing: bool = False,
                seed: int = 0) -> nn.Module:
    """The trainable policy: a HF causal LM, with a peft LoRA adapter when ``lora`` is given
    (its random init drawn from ``seed``, so two runs with the same seed start equal)."""
    if quantization is not None:
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantization!r}; known: {', '.join(QUANTIZATIONS)} (4-bit, bitsandbytes)")
        if lora is None:
            raise ValueError("quantization trains a LoRA adapter on a frozen 4-bit base (QLoRA): pass lora=dict(r=8) too")
        if isinstance(model, nn.Module):
            raise ValueError("quantization needs a model path or hub id, not an nn.Module: save it with "
                             "model.save_pretrained(dir) and pass dir")
        _require("bitsandbytes", f"quantization={quantization!r} needs bitsandbytes: pip install bitsandbytes")
    policy = model if isinstance(model, nn.Module) else _from_pretrained(str(model), quantization, torch_dtype)
    if gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            policy = _add_lora(policy, lora)
    return policy


def _from_pretrained(path: str, quantization: str | None, torch_dtype: Any) -> nn.Module:
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kwargs: dict[str, Any] = {"dtype": torch_dtype or torch.float32}
    if quantization is not None:
        compute = torch_dtype if isinstance(torch_dtype, torch.dtype) else torch.float32
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=quantization, bnb_4bit_compute_dtype=compute)
        kwargs["device_map"] = {"": "cuda" if torch.cuda.is_available() else "cpu"}
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def _add_lora(policy: nn.Module, lora: Any) -> nn.Module:
    _require("peft", "lora=... needs peft: pip install peft")
    from peft import LoraConfig, get_peft_model

    if isinstance(lora, dict):
        lora = LoraConfig(**{"r": 8, "lora_alpha": 16, "target_modules": "all-linear", "task_type": "CAUSAL_LM", **lora})
    return get_peft_model(policy, lora)


def _require(module: str, message: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ImportError(message) from err


def is_peft(policy: nn.Module) -> bool:
    return hasattr(policy, "disable_adapter") and hasattr(policy, "peft_config")


def frozen_copy(policy: nn.Module) -> nn.Module:
    """A frozen reference for full fine-tuning."""
    ref = copy.deepcopy(policy).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


@contextmanager
def reference_context(policy: nn.Module, reference: nn.Module | None) -> Iterator[nn.Module]:
    """Yield the model that plays the reference: the frozen copy, or the base with adapters off."""
    if reference is not None:
        yield reference
        return
    ctx = policy.disable_adapter() if is_peft(policy) else nullcontext()
    with ctx:
        yield policy
