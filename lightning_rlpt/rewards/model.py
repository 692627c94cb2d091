"""Reward models: a Hugging Face sequence-classification model as a reward function.

`RewardModel` wraps a frozen ``AutoModelForSequenceClassification`` (a hub id, a local
directory, or an ``nn.Module`` with its tokenizer) in the reward signature
``(prompts, completions, **columns) -> list[float]``. The score of a completion is the model's
logit for its label (``logits[:, label_index]``, label 0 of a one-label model, as TRL's
``GRPOTrainer`` does), read at the last token of the prompt + completion text. `RewardFunctions`
wraps reward models given in ``reward_funcs`` itself (see `looks_like_reward_model`).

The model is held outside the `RLModule`'s module tree, so it is never in the optimizer, the
checkpoint, DDP's gradient buckets or FSDP2's shards: each rank holds a full frozen copy, which
the module moves to its device in ``configure_model``. See docs/reward_models.md.
"""
from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from ..padding import right_pad


def looks_like_reward_model(spec: Any) -> bool:
    """Whether a ``reward_funcs`` entry names a reward model rather than a function.

    An ``nn.Module``; an existing directory (``save_pretrained``'s output); or a hub-id-like
    string: it holds a ``/``, no ``:`` and does not end in ``.py``, so none of the import paths
    `resolve_reward` takes (``pkg.mod:fn``, ``pkg.mod.fn``, ``path/to/file.py:fn``) is mistaken
    for one.

    Examples:
        >>> looks_like_reward_model("org/reward-model"), looks_like_reward_model("task:exact_answer")
        (True, False)
    """
    if isinstance(spec, nn.Module):
        return True
    if not isinstance(spec, str):
        return False
    return os.path.isdir(spec) or ("/" in spec and ":" not in spec and not spec.endswith(".py"))


class RewardModel:
    """A frozen sequence-classification model scoring prompt + completion.

    Formatting (TRL's): a conversational prompt (a list of ``{"role", "content"}`` dicts) and its
    completion (a string, taken as the assistant's message, or a list of messages) become one
    conversation written by the reward tokenizer's chat template; a string prompt is followed by
    its completion as plain text. The text is tokenized with ``add_special_tokens=False`` (the
    template writes its own special tokens), padded on the right with the reward tokenizer's pad
    token, and scored in chunks of ``batch_size`` rows, grouped by length so little padding is
    run. The model reads its logits at the last token that is not ``config.pad_token_id``, so that
    id is set to the tokenizer's pad id here (as TRL does).

    Args:
        model: a hub id, a local directory with ``config.json``, or an ``nn.Module`` whose output
            has ``logits [batch, num_labels]`` and whose ``config`` has ``num_labels``.
        tokenizer: a tokenizer or its path; default the model's own (its directory). It must have
            a pad token.
        batch_size: rows per forward.
        label_index: which logit is the score, an index or a name of ``config.label2id``; needed
            when the model has more than one label.
        max_length: keep at most the last ``max_length`` tokens of each text (cut from the left,
            so the completion's end, which the model reads, stays). None cuts nothing and refuses
            a text longer than the model's ``max_position_embeddings``.
        torch_dtype: dtype to load (or cast) the model in, e.g. ``"bfloat16"``; default float32.
            The trainer's precision does not apply to it: it is not part of the LightningModule.

    Examples:
        >>> rm = RewardModel("path/to/reward_model", batch_size=8)  # doctest: +SKIP
        >>> rm(["2+2="], ["4"])  # doctest: +SKIP
        [1.73]
        >>> RLModule("path/to/policy", reward_funcs=[rm, format_reward])  # doctest: +SKIP
    """

    def __init__(self, model: str | nn.Module, tokenizer: Any = None, batch_size: int = 16,
                 label_index: int | str | None = None, max_length: int | None = None, torch_dtype: Any = None):
        if batch_size < 1:
            raise ValueError(f"RewardModel batch_size must be >= 1 (got {batch_size})")
        if max_length is not None and max_length < 1:
            raise ValueError(f"RewardModel max_length must be >= 1 or None (got {max_length})")
        self.model = _load_model(model, torch_dtype)
        self.tokenizer = _load_tokenizer(self.model, model, tokenizer)
        self.label = _label(self.model.config, label_index)
        self.batch_size, self.max_length = batch_size, max_length
        # The model pools the last token that is not config.pad_token_id: it must be the id we pad with.
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval()
        self.model.requires_grad_(False)
        path = str(getattr(self.model.config, "_name_or_path", "") or "").rstrip("/\\")
        self.__name__ = os.path.basename(path) or type(self.model).__name__  # the metrics' rewards/<name>/...

    def to(self, device: torch.device | str) -> "RewardModel":
        self.model.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        return self.score_texts(self.texts(prompts, completions))

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        """The texts the model reads, one per completion (see the class docstring)."""
        return [self._text(p, c) for p, c in zip(prompts, completions)]

    def _text(self, prompt: Any, completion: Any) -> str:
        if isinstance(prompt, str):
            return prompt + (completion if isinstance(completion, str) else _content(completion))
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"reward model {self.__name__!r} got a conversational prompt but its tokenizer has "
                             "no chat template: set tokenizer.chat_template (a Jinja string) on the reward "
                             "tokenizer, or give string prompts")
        reply = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion)
        return self.tokenizer.apply_chat_template(list(prompt) + reply, tokenize=False)

    @torch.inference_mode()
    def score_texts(self, texts: list[str]) -> list[float]:
        """The label's logit for each text, in chunks of ``batch_size`` rows of similar length."""
        rows = [self._ids(text) for text in texts]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        scores = [0.0] * len(rows)
        device = self.device
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            chunk = [rows[i] for i in idx]
            ids = right_pad(chunk, self.tokenizer.pad_token_id, torch.long).to(device)
            mask = right_pad([[1] * len(r) for r in chunk], 0, torch.long, ids.shape[1]).to(device)
            logits = _logits(self.model(input_ids=ids, attention_mask=mask))
            for i, value in zip(idx, logits[:, self.label].float().tolist()):
                scores[i] = value
        return scores

    def _ids(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"reward model {self.__name__!r} got an empty text (prompt and completion both "
                             "empty): it has no token to read a score at")
        if self.max_length is not None:
            return ids[-self.max_length:]
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and len(ids) > limit:
            raise ValueError(f"reward model {self.__name__!r} got a text of {len(ids)} tokens, more than its "
                             f"max_position_embeddings={limit}: pass RewardModel(..., max_length={limit}) to keep "
                             "the last tokens, or shorten prompts/completions")
        return ids


def _content(messages: list[dict[str, Any]]) -> str:
    return "".join(str(m.get("content", "")) for m in messages)


def _logits(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.logits


def _load_model(model: str | nn.Module, torch_dtype: Any) -> nn.Module:
    dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
    if isinstance(model, nn.Module):
        _check_classifier(model)
        return model.to(dtype) if dtype is not None else model
    from transformers import AutoModelForSequenceClassification

    if os.path.isdir(model) and not os.path.exists(os.path.join(model, "config.json")):
        raise FileNotFoundError(f"reward model directory {model!r} has no config.json: pass the directory "
                                "save_pretrained wrote, or an import path 'module:function' for a reward function")
    try:
        loaded, info = AutoModelForSequenceClassification.from_pretrained(
            model, dtype=dtype or torch.float32, output_loading_info=True)
    except Exception as err:
        raise OSError(f"cannot load reward model {model!r} with AutoModelForSequenceClassification: "
                      f"{type(err).__name__}: {err}. Pass a local directory (save_pretrained's output) or a hub id; "
                      "a reward *function* is named 'module:function'") from err
    missing = info.get("missing_keys") or []
    if missing:
        raise ValueError(f"reward model {model!r} has no weights for {sorted(missing)[:4]} (architectures "
                         f"{getattr(loaded.config, 'architectures', None)}): its classification head would be random. "
                         "Pass a checkpoint saved from a sequence-classification model (a trained reward model)")
    return loaded


def _check_classifier(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_labels"):
        raise TypeError(f"{type(model).__name__} has no config.num_labels: a reward model is a Hugging Face "
                        "sequence-classification model (AutoModelForSequenceClassification), or a module with such a "
                        "config whose output has logits [batch, num_labels]")
    from transformers import PreTrainedModel
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as NAMES

    name = type(model).__name__
    if isinstance(model, PreTrainedModel) and name not in set(NAMES.values()) and "Reward" not in name:
        raise TypeError(f"{name} is not a sequence-classification model (its output is not one score per text): load "
                        "the reward model with AutoModelForSequenceClassification, or give a reward function")


def _load_tokenizer(model: nn.Module, source: str | nn.Module, tokenizer: Any):
    from transformers import AutoTokenizer

    if tokenizer is None:  # the model's own: its directory or hub id
        tokenizer = source if isinstance(source, str) else getattr(model.config, "_name_or_path", "")
        if not tokenizer:
            raise ValueError(f"reward model {type(model).__name__} was given as a module without its tokenizer: "
                             "pass RewardModel(model, tokenizer=tok)")
    if isinstance(tokenizer, str):
        try:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        except Exception as err:
            raise OSError(f"cannot load the reward model's tokenizer from {tokenizer!r}: {type(err).__name__}: {err}. "
                          "Pass RewardModel(model, tokenizer=tok)") from err
    if tokenizer.pad_token_id is None:
        raise ValueError(f"the reward model's tokenizer ({type(tokenizer).__name__}) has no pad token, so texts of "
                         "different lengths cannot share a batch. Set one before passing it, e.g. "
                         "tok.pad_token = tok.eos_token when the model was trained that way (TRL's fallback), or "
                         "tok.add_special_tokens({'pad_token': '<pad>'}) for a token the texts never contain")
    return tokenizer


def _label(config: Any, label_index: int | str | None) -> int:
    n = int(config.num_labels)
    labels = dict(getattr(config, "id2label", None) or {})
    if label_index is None:
        if n != 1:
            raise ValueError(f"the reward model has {n} labels {labels}: say which logit is the reward with "
                             "RewardModel(model, label_index=i) (an index or a label name), e.g. "
                             "reward_funcs=[RewardModel('path', label_index=1)]")
        return 0
    if isinstance(label_index, str):
        names = dict(getattr(config, "label2id", None) or {})
        if label_index not in names:
            raise ValueError(f"label_index={label_index!r} is not a label of the reward model; its labels are "
                             f"{sorted(names)}")
        return int(names[label_index])
    if not 0 <= label_index < n:
        raise ValueError(f"label_index={label_index} is out of range for a reward model with {n} labels "
                         f"{labels}: pick 0..{n - 1}")
    return int(label_index)
