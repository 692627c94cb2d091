"""RLModule refuses bad settings before any work, with a message that says how to fix them."""
import sys

import pytest
import tiny_task as task

from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule

GEN = dict(max_new_tokens=4, max_prompt_length=8)


def make(path, **kw):
    return RLModule(path, reward_funcs=[task.exact_answer], **{"group_size": 2, "generation": GEN, **kw})


def test_group_size_one_with_group_relative_estimator(warm_start_dir):
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        make(warm_start_dir, group_size=1)


@pytest.mark.parametrize("kw, match", [
    (dict(objective="ppo2"), r"unknown objective 'ppo2'; presets: grpo, dapo, dr_grpo.*; policy losses: .*ppo_clip"),
    (dict(advantage="gae"), r"unknown advantage estimator 'gae'; known: .*grpo"),
    (dict(kl_estimator="k9"), r"unknown KL estimator 'k9'; known: .*k1"),
    (dict(loss_aggregation="sum"), r"unknown loss aggregation 'sum'; known: token-mean"),
    (dict(quantization="int3", lora=dict(r=4)), r"unknown quantization 'int3'; known: nf4, fp4"),
    (dict(rollout_correction="tis"), r"unknown rollout_correction 'tis'"),
    (dict(generation=dict(temprature=1.0)), r"unknown generation option\(s\) \['temprature'\]"),
    (dict(generation=dict(max_new_tokens=4, temperature=0.0)), r"training rollouts must sample"),
    (dict(kl_coef=-1.0), r"kl_coef must be >= 0"),
    (dict(updates_per_rollout=0), r"updates_per_rollout must be >= 1"),
    (dict(val_samples=2, val_pass_k=[4]), r"more samples than val_samples=2"),
    (dict(lr=0.0), r"lr must be > 0 \(got 0.0\)"),
    (dict(lr=-1e-5), r"lr must be > 0"),
])
def test_unknown_names_and_bad_numbers(warm_start_dir, kw, match):
    with pytest.raises(ValueError, match=match):
        make(warm_start_dir, **kw)


def test_nf4_without_bitsandbytes(warm_start_dir, monkeypatch):
    """Simulates bitsandbytes being absent (it is installed here): its import fails."""
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(ImportError, match="pip install bitsandbytes"):
        make(warm_start_dir, quantization="nf4", lora=dict(r=4))


def test_quantization_needs_lora(warm_start_dir):
    with pytest.raises(ValueError, match="pass lora=dict"):
        make(warm_start_dir, quantization="nf4")


def test_tokenizer_without_pad_token_uses_eos_and_says_so(warm_start_dir):
    tok = task.build_tokenizer()
    tok.pad_token = None
    with pytest.warns(UserWarning, match="no pad token; using its EOS token '</s>'"):
        model = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, tokenizer=tok)
    assert model.tokenizer.pad_token_id == task.EOS_ID


def test_module_object_needs_tokenizer():
    with pytest.raises(ValueError, match="needs its tokenizer"):
        RLModule(task.build_model(), reward_funcs=[task.exact_answer], group_size=2)


def _fit(module, rows, steps=1):
    trainer = quiet_trainer(max_steps=steps)
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2))
    return trainer


def test_long_prompt_error_before_any_rollout(warm_start_dir):
    module = make(warm_start_dir, generation=dict(max_new_tokens=4, max_prompt_length=3, prompt_truncation="error"))
    with pytest.raises(ValueError, match=r"prompt 0 has 7 tokens, more than max_prompt_length=3 .*prompt_truncation='left'"):
        _fit(module, [{"prompt": "12+34=", "answer": "46"}] * 2)
    assert module.policy_version == 0


def test_long_prompt_truncated_from_the_left_and_counted(warm_start_dir):
    seen = []

    def spy(prompts, completions, answer, completion_ids, **_):
        seen.extend(prompts)
        return [0.0] * len(completions)

    module = RLModule(warm_start_dir, reward_funcs=[spy], group_size=2,
                      generation=dict(max_new_tokens=2, max_prompt_length=3))
    trainer = _fit(module, [{"prompt": "12+34=", "answer": "46"}] * 2)
    assert trainer.callback_metrics["prompts/truncated"] == 2
    from lightning_rlpt.rollout.collect import tokenize_prompts
    ids, cut = tokenize_prompts(module.tokenizer, ["12+34="], module.sampling)
    assert cut == 1 and module.tokenizer.decode(ids[0]) == "34="


def test_reward_error_stops_the_run_naming_the_function(warm_start_dir):
    def broken(prompts, completions, **_):
        raise KeyError("answer")

    module = RLModule(warm_start_dir, reward_funcs=[broken], group_size=2, generation=GEN)
    with pytest.raises(Exception, match="'broken' raised KeyError"):
        _fit(module, [{"prompt": "12+34="}] * 2)
    assert module.policy_version == 0


def test_reward_error_scored_zero_when_asked(warm_start_dir):
    def broken(prompts, completions, **_):
        raise KeyError("answer")

    module = RLModule(warm_start_dir, reward_funcs=[broken], group_size=2, generation=GEN, reward_on_error="zero")
    trainer = _fit(module, [{"prompt": "12+34="}] * 2)
    assert trainer.callback_metrics["rewards/broken/failures"] == 4


@pytest.mark.parametrize("path, reason", [("/no/such/dir", "does not exist"), ("./typo_model", "does not exist"),
                                          ("runs/x/missing", "does not exist")])
def test_missing_local_model_path_is_named_as_a_path_not_a_repo_id(path, reason):
    with pytest.raises(FileNotFoundError, match=rf"model path '{path}' {reason}, and it is not a hub id"):
        make(path)


def test_model_path_that_is_a_file(warm_start_dir):
    import os
    with pytest.raises(FileNotFoundError, match="is a file, not a model directory"):
        make(os.path.join(warm_start_dir, "config.json"))


def test_a_tokenizer_that_auto_loading_would_change_is_warned_about():
    """The calculator's warm start saves a custom tokenizer (digits in chunks of three) beside a qwen2
    config; transformers 5's AutoTokenizer loads it as Qwen2Tokenizer, which splits the digits. RLModule
    warns, naming the fix; a tokenizer passed in, or a directory that loads as saved, gives no warning."""
    import os
    import warnings

    from conftest import ROOT
    from transformers import AutoTokenizer

    from lightning_rlpt.model.loading import warn_if_not_the_file

    calculator = os.path.join(ROOT, "examples", "tool_calculator", "warm_start")
    reward = [lambda completions, **_: [0.0] * len(completions)]
    with pytest.warns(UserWarning, match=r"AutoTokenizer loaded Qwen2Tokenizer for .*warm_start, which tokenizes text "
                                         r"differently from that directory's tokenizer.json.*pass the tokenizer yourself"):
        RLModule(calculator, reward_funcs=reward)
    sys.path.insert(0, os.path.dirname(calculator))
    import calculator as calc  # examples/tool_calculator/calculator.py

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RLModule(calculator, reward_funcs=reward, tokenizer=calc.build_tokenizer())  # built: nothing to compare
        arithmetic = os.path.join(ROOT, "examples", "arithmetic", "warm_start")
        warn_if_not_the_file(AutoTokenizer.from_pretrained(arithmetic), arithmetic)  # loads as saved
