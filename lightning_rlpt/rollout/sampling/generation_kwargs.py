"""``SamplingConfig.generation_kwargs`` (TRL's name): extra keyword arguments for the engine's
sampler, ``transformers.generate`` for the HF engine and vLLM's ``SamplingParams`` (or the
completions request of a vLLM server) for the vLLM engines, e.g. ``no_repeat_ngram_size`` or
``bad_words_ids`` (transformers), ``bad_words`` or ``min_tokens`` (vLLM).

TRL lets these override its own generation settings. Here a key that `SamplingConfig` already
has, or that the rollout sets itself because the learner depends on it (one completion per row
from the row's own seed, the EOS stop, the behaviour log-probs), is refused with the setting to
use instead: overriding it would silently break what the learner assumes about its samples.
Each engine then checks the rest against what it really passes on (`check_hf_kwargs`,
`check_vllm_kwargs`, `check_server_kwargs`): a key the engine
would ignore is refused too, since a setting recorded as changing the distribution that changes
nothing is as wrong as one that breaks it.
"""
from __future__ import annotations

from typing import Any, Iterable

_SAMPLING = "use SamplingConfig's own field (generation=dict({key}=...))"
_ENGINE = "the engine sets it itself (the rollout depends on its value)"
_GROUP = "use RLModule(group_size=...): the rollout asks for one completion per row, G rows per prompt"
_SEARCH = ("the rollout samples each row from its own seed; beam or contrastive search does not sample "
           "from the policy, which the loss assumes")
_LOGPROBS = "use RLModule(rollout_logprobs=True): the engines report the sampled tokens' log-probs themselves"
_STOP = ("completions stop at the tokenizer's EOS; a stop string or id cuts completions where the learner "
         "and the reward functions do not expect it")

_PROMPT = ("the learner scores the whole prompt, so a prompt the engine cuts gives behaviour log-probs of another "
           "context (importance ratios and VESPO's weight silently wrong); use SamplingConfig.max_prompt_length "
           "with prompt_truncation")
_PARSE = "the rollout reads one whole completion per request, its tokens and their log-probs: this changes that"

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
    # vLLM's: each makes the engine's output differ from what the learner scores or parses
    "ignore_eos": ("completions end at the tokenizer's EOS (ignore_eos samples past it); to delay the EOS use "
                   "min_tokens (vLLM) or min_new_tokens (transformers)"),
    "truncate_prompt_tokens": _PROMPT, "truncation_side": _PROMPT, "prompt_embeds": _ENGINE,
    "echo": _PARSE, "stream": _PARSE, "stream_options": _PARSE, "output_kind": _PARSE,
    "model": "the server pool names the served model itself: another name samples from weights that are not the policy's",
    "logprob_token_ids": _LOGPROBS, "prompt_logprob_token_ids": _LOGPROBS, "prompt_logprob_start": _LOGPROBS,
    "flat_logprobs": _LOGPROBS, "repetition_detection": _STOP,
}

# Keys that do not change which tokens are drawn (everything else is assumed to).
NEUTRAL = ("use_cache", "cache_implementation", "skip_special_tokens", "spaces_between_special_tokens")


def check_generation_kwargs(kwargs: Any) -> None:
    """Refuse ``generation_kwargs`` that is not a dict of names, or that sets a reserved key.

    Args:
        kwargs: the value given (None: nothing extra).

    Examples:
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


# ---------------------------------------------------------------- per engine
# transformers.generate settings that act when decoding greedily over the HF engine's own per-row
# sampler (transformers' ``_get_logits_processor`` builds them whatever ``do_sample`` is), and ones
# that change how, not what, it computes.
HF_ALLOWED = ("no_repeat_ngram_size", "bad_words_ids", "min_new_tokens", "sequence_bias", "suppress_tokens",
              "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "exponential_decay_length_penalty",
              "renormalize_logits", "remove_invalid_values", *NEUTRAL, "cache_config", "compile_config",
              "disable_compile", "output_attentions", "output_hidden_states")
_WARPER = ("transformers applies it only with do_sample=True, and the HF engine draws with its own per-row sampler "
           "(do_sample=False): it would change nothing; use SamplingConfig's top_p, top_k or min_p")
_ASSISTED = ("assisted (speculative) decoding drafts tokens outside the engine's per-row sampler, so rows lose their "
             "own seeds; for speculative decoding use a vLLM engine")
_BEAM = "it acts only in beam or contrastive search, which the rollout never runs (it samples): it would change nothing"
HF_REFUSED: dict[str, str] = {
    **{k: _WARPER for k in ("typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")},
    **{k: _ASSISTED for k in ("prompt_lookup_num_tokens", "max_matching_ngram_size", "num_assistant_tokens",
                              "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_early_exit",
                              "assistant_lookbehind", "target_lookbehind", "assistant_ensemble_weight", "is_assistant",
                              "speculation_type", "use_mtp")},
    **{k: _BEAM for k in ("length_penalty", "early_stopping", "diversity_penalty", "constraints", "force_words_ids",
                          "low_memory")},
    "dola_layers": "DoLa contrasts the last layer with earlier ones: tokens would not come from the policy the loss assumes",
    "max_time": ("a wall-clock limit makes completions depend on the machine's speed (a resumed run would not sample "
                 "the same); use SamplingConfig.max_new_tokens"),
    "min_length": ("it counts the batch's padded prompt length, so a row's completion would depend on its batch; "
                   "use min_new_tokens"),
    "token_healing": _PROMPT,
}
# Fields of vLLM's completions request (vLLM 0.32 ``CompletionRequest``) the server rollout passes on;
# the server accepts any other name and ignores it, so the rest are refused.
SERVER_ALLOWED = ("frequency_penalty", "presence_penalty", "logit_bias", "allowed_token_ids", "bad_words", "min_tokens",
                  "watermarking", "structured_outputs", "response_format", "thinking_token_budget",
                  "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens", "priority",
                  "user", "cache_salt", "vllm_xargs", "return_tokens_as_token_ids")


def check_hf_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``kwargs`` for ``transformers.generate`` on the HF engine, refused unless each acts there.

    Args:
        kwargs: ``SamplingConfig.generation_kwargs`` (already past `check_generation_kwargs`).

    Returns:
        A copy, to pass to ``generate``.
    """
    if not kwargs:  # the usual case, on every generate: no GenerationConfig to build
        return {}
    from transformers import GenerationConfig

    extra, known = dict(kwargs), GenerationConfig()
    unknown = sorted(k for k in extra if not hasattr(known, k))
    if unknown:
        raise ValueError(f"generation_kwargs {unknown} are not transformers.GenerationConfig settings, which the HF "
                         "engine passes them to (vLLM's SamplingParams names, e.g. 'bad_words' or 'min_tokens', need "
                         "a vLLM engine; transformers has 'bad_words_ids' and 'min_new_tokens')")
    for key in extra:
        if key in HF_REFUSED:
            raise ValueError(f"generation_kwargs may not set {key!r} on the HF engine: {HF_REFUSED[key]}")
        if key not in HF_ALLOWED:
            raise ValueError(f"generation_kwargs may not set {key!r} on the HF engine: it decodes greedily over its own "
                             f"per-row sampler, where only these act: {', '.join(HF_ALLOWED)}")
    return extra


def check_vllm_kwargs(kwargs: dict[str, Any] | None, fields: Iterable[str]) -> dict[str, Any]:
    """``kwargs`` for vLLM's ``SamplingParams`` in the in-process engine, each one of its fields.

    Args:
        kwargs: ``SamplingConfig.generation_kwargs`` (already past `check_generation_kwargs`).
        fields: ``SamplingParams``' field names (its private ones, ``_...``, are not settings).

    Returns:
        A copy, to pass to ``SamplingParams``.
    """
    extra, known = dict(kwargs or {}), {f for f in fields if not f.startswith("_")}
    unknown = sorted(k for k in extra if k not in known)
    if unknown:
        raise ValueError(f"generation_kwargs {unknown} are not fields of vLLM's SamplingParams, which the vLLM engine "
                         "passes them to (transformers' names, e.g. 'no_repeat_ngram_size' or 'bad_words_ids', need the "
                         "HF engine; vLLM has 'bad_words' and 'min_tokens')")
    return extra


def check_server_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``kwargs`` for a vLLM server's completions request, refused unless the rollout passes them on.

    Args:
        kwargs: ``SamplingConfig.generation_kwargs`` (already past `check_generation_kwargs`).

    Returns:
        A copy, to add to each request.
    """
    extra = dict(kwargs or {})
    for key in extra:
        if key not in SERVER_ALLOWED:
            raise ValueError(f"generation_kwargs may not set {key!r} on a vLLM server: the server would ignore an "
                             f"unknown field silently, so the rollout passes only these: {', '.join(SERVER_ALLOWED)}")
    return extra


def changed_by(kwargs: dict[str, Any] | None) -> list[str]:
    """``generation_kwargs`` entries that may change the sampled distribution, as ``name=value``."""
    return [f"generation_kwargs[{k!r}]={v!r}" for k, v in (kwargs or {}).items() if k not in NEUTRAL]
