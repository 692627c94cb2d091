"""``SamplingConfig.generation_kwargs`` (TRL's name): passed to ``transformers.generate`` by the HF
engine (``bad_words_ids`` visibly bans tokens from a real tiny model's completions, row seeds
unchanged) and to vLLM's ``SamplingParams`` by the vLLM engine; keys `SamplingConfig` or the
rollout already sets are refused naming what to use, and the HF engine refuses a key that is not
a transformers generation setting before generating."""
import pytest
import torch
from transformers import AutoModelForCausalLM

import tiny_task as task
from lightning_rlpt import RLModule
from lightning_rlpt.rollout import HFGenerateEngine, SamplingConfig
from lightning_rlpt.rollout.sampling.generation_kwargs import check_hf_kwargs, check_server_kwargs

PROMPTS = ["12+34=", "5+6=", "7=", "99+1=", "3+3=", "45+45="]
LOW_DIGITS = [task.SYMBOLS.index(d) + len(task.SPECIALS) for d in "01234"]


@pytest.fixture(scope="module")
def engine(warm_start_dir):
    tok = task.build_tokenizer()
    policy = AutoModelForCausalLM.from_pretrained(warm_start_dir).eval()
    return HFGenerateEngine(policy, tok.eos_token_id, tok.pad_token_id), tok(PROMPTS)["input_ids"]


def _completions(engine, **extra):
    hf, rows = engine
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0, **extra)
    rows = [r for r in rows for _ in range(4)]
    return hf.generate(rows, sampling, seed=[11 * i for i in range(len(rows))]).completion_ids


def test_bad_words_ids_ban_tokens_from_the_hf_engines_completions(engine):
    plain = _completions(engine)
    banned = _completions(engine, generation_kwargs={"bad_words_ids": [[t] for t in LOW_DIGITS]})
    assert any(t in LOW_DIGITS for row in plain for t in row)  # the model writes these digits...
    assert not any(t in LOW_DIGITS for row in banned for t in row)  # ...and cannot with the kwargs
    # rows whose plain completion had no banned token are sampled exactly as before (same row seeds)
    same = [i for i, row in enumerate(plain) if not set(row) & set(LOW_DIGITS)]
    assert same and all(plain[i] == banned[i] for i in same)


def test_a_key_transformers_does_not_know_is_refused_before_generating(engine):
    with pytest.raises(ValueError, match=r"generation_kwargs \['min_tokens'\] are not transformers.GenerationConfig "
                                         r"settings.*'min_new_tokens'"):
        _completions(engine, generation_kwargs={"min_tokens": 2})


def test_the_hf_engine_refuses_a_warper_it_would_ignore_before_generating(engine):
    """transformers builds typical_p's warper only with do_sample=True; the engine decodes with
    do_sample=False over its own sampler, so the key would be recorded as a change and change nothing."""
    with pytest.raises(ValueError, match=r"may not set 'typical_p' on the HF engine: transformers applies it only "
                                         r"with do_sample=True.*use SamplingConfig's top_p, top_k or min_p"):
        _completions(engine, generation_kwargs={"typical_p": 0.5})


@pytest.mark.parametrize("key, why", [
    ("epsilon_cutoff", r"only with do_sample=True"),
    ("prompt_lookup_num_tokens", r"assisted \(speculative\) decoding drafts tokens outside the engine's per-row "
                                 r"sampler.*use a vLLM engine"),
    ("max_time", r"wall-clock limit.*use SamplingConfig.max_new_tokens"),
    ("min_length", r"padded prompt length.*use min_new_tokens"),
    ("length_penalty", r"only in beam or contrastive search"),
    ("guidance_scale", r"only these act: no_repeat_ngram_size, bad_words_ids"),
])
def test_the_hf_engine_refuses_settings_that_do_nothing_or_break_row_seeds(key, why):
    with pytest.raises(ValueError, match=rf"may not set '{key}' on the HF engine: .*{why}"):
        check_hf_kwargs({key: 1})
    assert check_hf_kwargs({"no_repeat_ngram_size": 2, "min_new_tokens": 1}) == {"no_repeat_ngram_size": 2,
                                                                                 "min_new_tokens": 1}


def test_the_server_engine_passes_only_fields_vllm_reads():
    """A vLLM server accepts an unknown request field and ignores it: such a key is refused."""
    assert check_server_kwargs({"bad_words": ["7"], "min_tokens": 2}) == {"bad_words": ["7"], "min_tokens": 2}
    with pytest.raises(ValueError, match=r"may not set 'typical_p' on a vLLM server: the server would ignore an "
                                         r"unknown field silently.*frequency_penalty"):
        check_server_kwargs({"typical_p": 0.5})


@pytest.mark.parametrize("key, use", [
    ("temperature", r"use SamplingConfig's own field \(generation=dict\(temperature=...\)\)"),
    ("max_tokens", r"use SamplingConfig.max_new_tokens"),
    ("num_return_sequences", r"use RLModule\(group_size=...\)"),
    ("n", r"use RLModule\(group_size=...\)"),
    ("num_beams", r"the rollout samples each row from its own seed; beam or contrastive search does not sample"),
    ("seed", r"use RLModule\(seed=...\)"),
    ("logprobs", r"use RLModule\(rollout_logprobs=True\)"),
    ("do_sample", r"use SamplingConfig.temperature"),
    ("stop", r"completions stop at the tokenizer's EOS"),
    ("truncate_prompt_tokens", r"the learner scores the whole prompt.*use SamplingConfig.max_prompt_length"),
    ("ignore_eos", r"completions end at the tokenizer's EOS \(ignore_eos samples past it\).*min_tokens"),
    ("echo", r"the rollout reads one whole completion per request"),
    ("stream", r"the rollout reads one whole completion per request"),
    ("model", r"the server pool names the served model itself"),
])
def test_reserved_keys_are_refused_naming_what_to_use(key, use):
    with pytest.raises(ValueError, match=rf"generation_kwargs may not set '{key}': {use}"):
        SamplingConfig(generation_kwargs={key: 1})


def test_not_a_dict_is_refused_and_the_module_checks_at_construction(warm_start_dir):
    with pytest.raises(ValueError, match=r"generation_kwargs must be a dict of keyword arguments"):
        SamplingConfig(generation_kwargs=[("no_repeat_ngram_size", 2)])
    with pytest.raises(ValueError, match=r"may not set 'top_k'"):
        RLModule(warm_start_dir, reward_funcs=[task.exact_answer], generation=dict(generation_kwargs={"top_k": 5}))


def test_they_count_as_a_distribution_change_and_validation_copies_them(warm_start_dir):
    sampling = SamplingConfig(generation_kwargs={"no_repeat_ngram_size": 2, "use_cache": True})
    assert sampling.distribution_changes() == ["generation_kwargs['no_repeat_ngram_size']=2"]
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], kl_coef=0.0,
                      generation=dict(max_new_tokens=4, generation_kwargs={"no_repeat_ngram_size": 2}))
    assert module.val_sampling.generation_kwargs == {"no_repeat_ngram_size": 2}


@pytest.mark.slow
def test_the_vllm_engine_puts_them_in_sampling_params():
    """Only vLLM's ``SamplingParams`` is built (importing vLLM takes ~40 s here; no engine starts)."""
    from lightning_rlpt.rollout.vllm.engine import VLLMEngine

    engine = object.__new__(VLLMEngine)  # sampling_params reads only the EOS id
    engine.eos_token_id = task.EOS_ID
    sampling = SamplingConfig(max_new_tokens=5, generation_kwargs={"bad_words": ["7"], "min_tokens": 2})
    params = engine.sampling_params(sampling, [], [3, 4])
    assert [p.seed for p in params] == [3, 4]
    assert all(p.bad_words == ["7"] and p.min_tokens == 2 and p.max_tokens == 5 for p in params)
    # a transformers name: refused naming the engine, not vLLM's bare "Unexpected keyword argument"
    with pytest.raises(ValueError, match=r"generation_kwargs \['no_repeat_ngram_size'\] are not fields of vLLM's "
                                         r"SamplingParams.*need the HF engine"):
        engine.sampling_params(SamplingConfig(generation_kwargs={"no_repeat_ngram_size": 2}), [], [3])
