"""Tiny fits and spies shared by the callback tests (tests/callbacks/)."""
from __future__ import annotations

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import HFGenerateEngine, PromptDataModule, RLCallback, RLModule
from lightning_rlpt.rollout import RolloutOutput

GEN = dict(max_new_tokens=4, max_prompt_length=8)


class OffPolicyEngine(HFGenerateEngine):
    """The HF engine reporting behaviour log-probs shifted by a fixed, token-dependent amount, so
    importance weights differ from 1 deterministically (as a stale or low-precision engine would)."""

    def generate(self, prompt_ids, sampling, seed):
        out = super().generate(prompt_ids, sampling, seed)
        shifted = [[lp + 0.4 * ((tok % 3) - 1) for lp, tok in zip(lps, ids)]
                   for lps, ids in zip(out.logprobs, out.completion_ids)]
        return RolloutOutput(out.completion_ids, shifted)


def make_module(model_dir, *, engine: str | None = None, **settings) -> RLModule:
    kwargs = dict(reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, seed=5, kl_coef=0.05, generation=GEN)
    if engine == "off_policy":  # off the policy on purpose (as a stale engine): the parity probe measures, never stops
        kwargs["parity_threshold"] = None
    module = RLModule(model_dir, **{**kwargs, **settings})
    if engine is not None:
        cls = OffPolicyEngine if engine == "off_policy" else HFGenerateEngine
        module.rollout_engine = cls(module.policy, module.tokenizer.eos_token_id, module.tokenizer.pad_token_id,
                                    return_logprobs=True)
    return module


def make_data(rows, val_rows=None, batch_size: int = 2, **kwargs) -> PromptDataModule:
    return PromptDataModule(rows, val_data=val_rows, batch_size=batch_size, seed=7, **kwargs)


class Spy(RLCallback):
    """Calls ``fn(hook, trainer, module, x)`` at every RL hook and optimizer step."""

    def __init__(self, fn):
        self.fn = fn

    def on_rewards_computed(self, trainer, module, experience):
        self.fn("rewards", trainer, module, experience)

    def on_advantages_computed(self, trainer, module, experience):
        self.fn("advantages", trainer, module, experience)

    def on_before_loss(self, trainer, module, minibatch):
        self.fn("loss", trainer, module, minibatch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.fn("optimizer", trainer, pl_module, optimizer)


def fit(module, callbacks, rows, steps=2, batch_size=4, **kwargs):
    val = kwargs.pop("val_rows", None)
    trainer = quiet_trainer(max_steps=steps, callbacks=callbacks, **kwargs)
    trainer.fit(module, datamodule=make_data(rows, val, batch_size=batch_size))
    return trainer
