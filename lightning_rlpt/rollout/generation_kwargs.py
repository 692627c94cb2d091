"""``SamplingConfig.generation_kwargs`` (TRL's name): extra keyword arguments for the engine's
sampler, ``transformers.generate`` for the HF engine and vLLM's ``SamplingParams`` (or the
completions request of a vLLM server) for the vLLM engines, e.g. ``no_repeat_ngram_size`` or
``bad_words_ids`` (transformers), ``bad_words`` or ``min_tokens`` (vLLM).

TRL lets these override its own generation settings. Here a key that `SamplingConfig` already
has, or that the rollout sets itself because the learner depends on it (one completion per row
from the row's own seed, the EOS stop, the behaviour log-probs), is refused with the setting to
use instead: overriding it would silently break what the learner assumes about its samples.
"""
from __future__ import annotations

from typing import Any

_SAMPLING = "use SamplingConfig's own field (generation=dict({key}=...))"
_ENGINE = "the engine sets it itself (the rollout depends on its value)"
_GROUP = "use RLModule(group_size=...): the rollout asks for one completion per row, G rows per prompt"
_SEARCH = ("the rollout samples each row from its own seed; beam or contrastive search does not sample "
           "from the policy, which the loss assumes")
_LOGPROBS = "use RLModule(rollout_logprobs=True): the engines report the sampled tokens' log-probs themselves"
_STOP = ("completions stop at the tokenizer's EOS; a stop string or id cuts completions where the learner "
         "and the reward functions do not expect it")

# Refused key -> why, and what to use instead ("{key}" is filled in).
RESERVED: dict[str, str] = {
    **{k: _SAMPLING for k in ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")},
    "max_tokens": "use SamplingConfig.max_new_tokens (generation=dict(max_new_tokens=...))",
    "max_length": "use SamplingConfig.max_new_tokens (generation=dict(max_new_tokens=...))",
    "do_sample": "use SamplingConfig.temperature (0: greedy, for validation only)",
    "num_return_sequences": _GROUP, "n": _GROUP, "best_of": _GROUP,
    "num_beams": _SEARCH, "num_beam_groups": _SEARCH, "penalty_alpha": _SEARCH, "use_beam_search": _SEARCH,
    "seed": "use RLModule(seed=...): every row is seeded by the rollout", "generator": "use RLModule(seed=...)",
    "logprobs": _LOGPROBS, "prompt_logprobs": _LOGPROBS, "output_scores": _LOGPROBS, "output_logits": _LOGPROBS,
    "return_dict_in_generate": _ENGINE, "logits_processor": _ENGINE, "logits_processors": _ENGINE,
    "synced_gpus": _ENGINE, "generation_config": _ENGINE, "input_ids": _ENGINE, "attention_mask": _ENGINE,
    "inputs": _ENGINE, "prompt": _ENGINE, "streamer": _ENGINE, "stopping_criteria": _STOP,
    "eos_token_id": _STOP, "pad_token_id": _ENGINE, "stop": _STOP, "stop_strings": _STOP, "stop_token_ids": _STOP,
    "return_token_ids": _ENGINE, "detokenize": _ENGINE,
}

# Keys that do not change which tokens are drawn (everything else is assumed to).
NEUTRAL = ("use_cache", "cache_implementation", "skip_special_tokens", "spaces_between_special_tokens")


def check_generation_kwargs(kwargs: Any) -> None:
    """Refuse ``generation_kwargs`` that is not a dict of names, or that sets a reserved key.

    Args:
        kwargs: the value given (None: nothing extra).

    Example:
        >>> check_generation_kwargs({"no_repeat_ngram_size": 2})
        >>> check_generation_kwargs({"n": 4})
        Traceback (most recent call last):
        ...
        ValueError: generation_kwargs may not set 'n': use RLModule(group_size=...): the rollout asks for one completion per row, G rows per prompt
    """
    if kwargs is None:
        return
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"generation_kwargs must be a dict of keyword arguments for the engine's sampler, e.g. "
                         f"{{'no_repeat_ngram_size': 3}} (got {kwargs!r})")
    for key in kwargs:
        if key in RESERVED:
            raise ValueError(f"generation_kwargs may not set {key!r}: {RESERVED[key].format(key=key)}")


def changed_by(kwargs: dict[str, Any] | None) -> list[str]:
    """``generation_kwargs`` entries that may change the sampled distribution, as ``name=value``."""
    return [f"generation_kwargs[{k!r}]={v!r}" for k, v in (kwargs or {}).items() if k not in NEUTRAL]
