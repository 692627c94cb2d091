"""Tiny fits shared by the tests/test_callbacks_*.py files."""
from __future__ import annotations

import task
from lightning_rlpt import HFGenerateEngine, PromptDataModule, RLModule
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
    module = RLModule(model_dir, **{**kwargs, **settings})
    if engine is not None:
        cls = OffPolicyEngine if engine == "off_policy" else HFGenerateEngine
        module.rollout_engine = cls(module.policy, module.tokenizer.eos_token_id, module.tokenizer.pad_token_id,
                                    return_logprobs=True)
    return module


def make_data(rows, val_rows=None, batch_size: int = 2, **kwargs) -> PromptDataModule:
    return PromptDataModule(rows, val_data=val_rows, batch_size=batch_size, seed=7, **kwargs)
