"""Loading the policy (full, LoRA or QLoRA), its tokenizer and its reference."""
from __future__ import annotations

import copy
import importlib
import os
import warnings
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from torch import nn

QUANTIZATIONS = ("nf4", "fp4")


def check_model_source(model: Any) -> None:
    """Refuse a model string that is neither an existing directory nor shaped like a hub id, before
    transformers answers with "Repo id must be in the form ..." about a mistyped local path."""
    if isinstance(model, nn.Module):
        return
    path = os.fspath(model) if hasattr(model, "__fspath__") else model
    if not isinstance(path, str):
        raise TypeError(f"model must be a hub id, a local directory or an nn.Module (got {type(model).__name__})")
    if os.path.isdir(path):
        return
    looks_local = path.startswith((os.sep, ".", "~")) or path.count("/") > 1 or "\\" in path or os.path.exists(path)
    if looks_local:
        reason = "is a file, not a model directory" if os.path.exists(path) else "does not exist"
        raise FileNotFoundError(f"model path {path!r} {reason}, and it is not a hub id ('org/name'): pass the "
                                "directory that holds config.json and the weights (save_pretrained's output)")


# Dropout rates that models keep as plain floats (e.g. Llama's attention reads
# ``self.attention_dropout`` in train mode), on their config and on their modules.
DROPOUT_RATES = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                 "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate")


def zero_dropout(model: nn.Module) -> None:
    """Dropout off for good: every ``nn.Dropout`` at p = 0 and every float dropout rate of the
    config and the modules at 0, so train mode computes what eval mode does (as TRL's
    ``disable_dropout_in_model``, which also covers the rates attention layers read directly)."""
    for obj in [getattr(model, "config", None), *model.modules()]:
        if isinstance(obj, nn.Dropout):
            obj.p = 0.0
        for key in DROPOUT_RATES:
            if isinstance(getattr(obj, key, None), float):
                setattr(obj, key, 0.0)


def has_active_dropout(model: nn.Module) -> bool:
    return any((isinstance(m, nn.Dropout) and m.p > 0)
               or any(isinstance(getattr(m, k, None), float) and getattr(m, k) > 0 for k in DROPOUT_RATES)
               for m in model.modules())


TOKENIZER_PROBE = "user\n123*4567 = 5,600,088\tHello, World!  Two  spaces.\n"


def warn_if_not_the_file(tokenizer: Any, path: str) -> None:
    """Warn when a local directory's ``tokenizer.json`` tokenizes a probe differently from what
    ``AutoTokenizer`` loaded. transformers 5 picks the tokenizer class from ``config.json``'s model
    type, and that class may apply its own pre-tokenizer: a custom tokenizer saved beside a
    ``qwen2`` config (digits in chunks, say) then loads as Qwen2's, splits text differently, and
    the model sees prompts it was never trained on — with no error anywhere."""
    file = os.path.join(path, "tokenizer.json") if path and os.path.isdir(path) else None
    if file is None or not os.path.isfile(file):
        return
    from tokenizers import Tokenizer

    expected = Tokenizer.from_file(file).encode(TOKENIZER_PROBE, add_special_tokens=False).ids
    if tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"] != expected:
        warnings.warn(f"AutoTokenizer loaded {type(tokenizer).__name__} for {path}, which tokenizes text differently "
                      f"from that directory's tokenizer.json (probe {TOKENIZER_PROBE!r}): the model would see other "
                      "token ids than it was trained on. If the file is right, pass the tokenizer yourself: "
                      "RLModule(..., tokenizer=PreTrainedTokenizerFast(tokenizer_file=<dir>/tokenizer.json, ...)) "
                      "or the object you built", stacklevel=3)


def load_tokenizer(model: str | nn.Module, tokenizer: Any | None):
    from transformers import AutoTokenizer

    if tokenizer is None:
        if not isinstance(model, (str, bytes)) and not hasattr(model, "__fspath__"):
            raise ValueError("a model given as an nn.Module needs its tokenizer: RLModule(model, ..., tokenizer=tok)")
        tokenizer = str(model)
    if isinstance(tokenizer, str):  # a path or hub id: loaded here, and checked against its own tokenizer.json
        path = tokenizer
        tokenizer = AutoTokenizer.from_pretrained(path)
        warn_if_not_the_file(tokenizer, path)
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
    untie_differing_head(policy)
    if gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            policy = _add_lora(policy, lora)
    return policy


def untie_differing_head(model: nn.Module) -> None:
    """A config that ties the LM head to the embedding, over a checkpoint whose two tensors differ:
    transformers keeps them apart (it ties only equal tensors), so the model computes an untied
    head while its config says tied. Every copy made from the config (vLLM's, an export) would then
    tie the head to the embedding and compute another policy. The config is made to say what the
    model computes (untied), with a warning: the checkpoint's head is the one trained and served."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    configs = [c for c in {id(c): c for c in (model.config, model.config.get_text_config())}.values()
               if getattr(c, "tie_word_embeddings", False)]
    if not configs or head is None or embed is None or head.weight is embed.weight:
        return
    for config in configs:
        config.tie_word_embeddings = False
    warnings.warn("the model's config ties its LM head to the input embedding (tie_word_embeddings=True), but the "
                  "checkpoint holds two different tensors, and transformers loaded them untied: lightning-rlpt "
                  "trains, serves and exports them untied (config.tie_word_embeddings=False), as the model computes. "
                  "If the head should be the embedding, save the checkpoint without lm_head.weight",
                  UserWarning, stacklevel=3)


def _from_pretrained(path: str, quantization: str | None, torch_dtype: Any) -> nn.Module:
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kwargs: dict[str, Any] = {"dtype": torch_dtype or torch.float32}
    if quantization is not None:
        compute = torch_dtype if isinstance(torch_dtype, torch.dtype) else torch.float32
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=quantization, bnb_4bit_compute_dtype=compute)
        kwargs["device_map"] = {"": "cuda" if torch.cuda.is_available() else "cpu"}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if quantization is not None:
        keep_4bit_layout(model)
    return model


def keep_4bit_layout(model: nn.Module) -> None:
    """Stop bitsandbytes from repacking 4-bit weights for its bf16 CPU kernel.

    On CPUs with AVX512-BF16, a ``Linear4bit`` run in eval mode without grad (as during
    ``generate``) rewrites its weight in place, for good, and from then on computes in bf16,
    training included: log-probs move by ~5e-2 and the weights can no longer be dequantised
    exactly for a vLLM sync. Training wants the plain fp32-compute path throughout.
    """
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def _add_lora(policy: nn.Module, lora: Any) -> nn.Module:
    _require("peft", "lora=... needs peft: pip install peft")
    from peft import LoraConfig, get_peft_model

    if isinstance(lora, dict):
        lora = LoraConfig(**{"r": 8, "lora_alpha": 16, "target_modules": "all-linear", "task_type": "CAUSAL_LM", **lora})
    head, embed = policy.get_output_embeddings(), policy.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    policy = get_peft_model(policy, lora)
    if tied and not getattr(lora, "ensure_weight_tying", False) and _adapted(policy.get_output_embeddings()):
        raise ValueError("the LoRA config adapts the LM head (target_modules or modules_to_save name lm_head) of a model "
                         "whose head is tied to its input embedding: the adapter would train the head apart from the "
                         "embedding while the engines (vLLM, an export) keep them one tensor, and would sample from "
                         "another model. Leave lm_head out (target_modules='all-linear' does), or untie the model first "
                         "(config.tie_word_embeddings=False, save_pretrained, load that)")
    return policy


def _adapted(module: nn.Module | None) -> bool:
    """A LoRA layer or a trained copy (peft's ``modules_to_save``) in place of ``module``."""
    return module is not None and (hasattr(module, "lora_A") or type(module).__name__ == "ModulesToSaveWrapper")


def lora_as_dict(lora: Any) -> dict[str, Any] | None:
    """A LoRA config as plain data (for hyper-parameters and checkpoints); `_add_lora` takes it back."""
    if lora is None or isinstance(lora, dict):
        return None if lora is None else dict(lora)
    plain = {}
    for key, value in lora.to_dict().items():
        value = sorted(value) if isinstance(value, set) else value
        plain[key] = getattr(value, "value", value)  # enums (peft_type, task_type) as strings
    return plain


def _require(module: str, message: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ImportError(message) from err


def is_peft(policy: nn.Module) -> bool:
    return hasattr(policy, "disable_adapter") and hasattr(policy, "peft_config")


@contextmanager
def reference_context(policy: nn.Module, reference: nn.Module | None) -> Iterator[nn.Module]:
    """Yield the model that plays the reference: the frozen copy; under LoRA/QLoRA the
    ``reference`` adapter when one was added (`add_reference_adapter`), else the base with
    adapters off. With dropout still active the reference runs in eval mode (deterministic)."""
    model = reference if reference is not None else policy
    with _eval_if_dropout(model):
        with _reference_model(policy, reference) as ref:
            yield ref


@contextmanager
def _eval_if_dropout(model: nn.Module) -> Iterator[None]:
    if not (model.training and has_active_dropout(model)):
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train()


@contextmanager
def _reference_model(policy: nn.Module, reference: nn.Module | None) -> Iterator[nn.Module]:
    if reference is not None:
        yield reference
    elif is_peft(policy) and REFERENCE_ADAPTER in policy.peft_config:
        with _active_adapter(policy, REFERENCE_ADAPTER):
            yield policy
    else:
        with policy.disable_adapter() if is_peft(policy) else nullcontext():
            yield policy


# ---------------------------------------------------------------- a movable reference under LoRA
REFERENCE_ADAPTER = "reference"


def add_reference_adapter(policy: nn.Module) -> None:
    """Give a peft policy a frozen second adapter, ``reference``, that `reference_context`
    activates, so reference resets (`ReferenceReset`) can move the reference under LoRA/QLoRA.
    It starts as a copy of the active adapter with ``lora_B`` zeroed (no random draw): until first
    moved it equals the base with adapters disabled, deterministically."""
    if REFERENCE_ADAPTER in policy.peft_config:
        return
    active = policy.active_adapter
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    with torch.random.fork_rng(devices=[]):
        policy.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(policy.peft_config[active]))
    policy.set_adapter(active)
    for name, p in policy.named_parameters():
        p.requires_grad_(name in trainable)
    params = dict(policy.named_parameters())
    key, ref_key = f".{active}.", f".{REFERENCE_ADAPTER}."
    with torch.no_grad():
        for name, p in params.items():
            source = params.get(name.replace(ref_key, key)) if ref_key in name else None
            if source is not None:
                p.copy_(torch.zeros_like(p) if "lora_B" in name else source)


def reference_pairs(policy: nn.Module, reference: nn.Module | None) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """``(policy parameter, reference parameter)`` pairs a reference update copies between: all
    weights of a frozen full-FT copy, or the active adapter's and the ``reference`` adapter's."""
    if reference is not None:
        ref = dict(reference.named_parameters())
        return [(p, ref[n]) for n, p in policy.named_parameters()]
    if not (is_peft(policy) and REFERENCE_ADAPTER in policy.peft_config):
        raise ValueError("this policy has no movable reference: call add_reference_adapter(policy) (LoRA/QLoRA) "
                         "or build the module with reference=True (full fine-tuning)")
    params = dict(policy.named_parameters())
    key, ref_key = f".{policy.active_adapter}.", f".{REFERENCE_ADAPTER}."
    return [(p, params[n.replace(key, ref_key)]) for n, p in params.items()
            if key in n and n.replace(key, ref_key) in params]


@contextmanager
def _active_adapter(policy: nn.Module, name: str) -> Iterator[None]:
    # peft's set_adapter also flips requires_grad; restore the flags so the optimizer's
    # parameters stay exactly the trainable ones.
    previous = policy.active_adapter
    flags = [(p, p.requires_grad) for p in policy.parameters()]
    policy.set_adapter(name)
    try:
        yield
    finally:
        policy.set_adapter(previous)
        for p, flag in flags:
            p.requires_grad_(flag)
