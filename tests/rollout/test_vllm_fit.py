"""End to end with a vLLM engine that `VLLMRollout` starts and frees itself: the arithmetic
demo (examples/arithmetic/run.py's settings) learns as it does with the HF engine."""
import argparse
import os
import sys
import weakref

import lightning as L
import pytest

from conftest import ARITHMETIC, quiet_trainer

sys.path.insert(0, ARITHMETIC)  # this test runs the demo's own loop on vLLM
import run  # noqa: E402  (examples/arithmetic/run.py)
import tiny_task as task  # noqa: E402
from lightning_rlpt import PromptDataModule, RLModule  # noqa: E402
from lightning_rlpt.callbacks import VLLMRollout  # noqa: E402

STEPS = 50


def test_teardown_frees_the_engine(warm_start_dir, arithmetic_rows):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    seen = {}

    class Spy(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            seen["llm"] = weakref.ref(pl_module.rollout_engine.llm)
            seen["dir"] = pl_module.rollout_engine._tmpdir

    callback = VLLMRollout()
    quiet_trainer(max_steps=1, callbacks=[callback, Spy()]).fit(module, datamodule=PromptDataModule(arithmetic_rows))
    assert callback.engine is None and module.rollout_engine is None
    assert seen["llm"]() is None and not os.path.exists(seen["dir"])  # LLM collected, export removed


def _demo(warm_start_dir, callbacks):
    """``STEPS`` GRPO steps with run.py's settings; held-out greedy accuracy before/after."""
    L.seed_everything(0, verbose=False)
    args = argparse.Namespace(model=warm_start_dir, steps=STEPS, prompts=16, group_size=8, lr=3e-5, kl_coef=0.001,
                              seed=0)
    module, data = run.build(args)
    before = quiet_trainer().validate(module, datamodule=data, verbose=False)[0]["val/accuracy"]
    trainer = quiet_trainer(max_steps=STEPS, callbacks=callbacks, val_check_interval=STEPS,
                            check_val_every_n_epoch=None)
    trainer.fit(module, datamodule=data)
    during = float(trainer.callback_metrics["val/accuracy"])  # validated through the fit's engine
    after = quiet_trainer().validate(module, datamodule=data, verbose=False)[0]["val/accuracy"]  # HF engine
    return before, during, after


@pytest.mark.slow
def test_arithmetic_demo_learns_with_vllm_like_with_hf(warm_start_dir):
    before, during, after = _demo(warm_start_dir, [VLLMRollout()])
    assert abs(before - 0.353) < 0.005  # the shipped warm start (35.3 % on the 300 test sums)
    assert after - before > 0.20  # the warm start leaves room; 50 steps gain well over 20 points
    assert abs(during - after) < 1e-9  # vLLM's greedy validation equals HF generate's
    _, _, hf_after = _demo(warm_start_dir, [])
    assert abs(after - hf_after) < 0.08  # measured: HF engine 68.0 %
