"""`HFGenerateEngine`: the default rollout engine, ``transformers.generate`` on the policy itself."""
from __future__ import annotations

import torch
from torch import nn

from ..model.distributed import is_sharded, world_size
from ..padding import left_pad
from .engine import RolloutEngine, RolloutOutput, WeightSource, cut_at_eos, runs_of_equal
from .sampling import SamplingConfig


class HFGenerateEngine(RolloutEngine):
    """``transformers.generate`` on the policy itself (always on-policy, no weight copy).

    Sampling draws from a private RNG stream seeded by ``seed`` for each call, so the global
    torch RNG is untouched and a resumed run samples exactly what an uninterrupted one does.

    Args:
        policy: the Hugging Face causal LM being trained (LoRA/QLoRA wrappers included).
        eos_token_id / pad_token_id: the tokenizer's ids.
        return_logprobs: also report behaviour log-probs from generate's scores (costs an
            ``[N, C, V]`` buffer; off by default since this engine *is* the policy).
    """

    def __init__(self, policy: nn.Module, eos_token_id: int, pad_token_id: int, return_logprobs: bool = False):
        self.policy = policy
        self.policy_version = 0
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.return_logprobs = return_logprobs

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        if isinstance(seed, int):
            return self._generate(prompt_ids, sampling, seed)
        parts = [self._generate(prompt_ids[a:b], sampling, seed[a]) for a, b in runs_of_equal(seed)]
        logprobs = None if not self.return_logprobs else [lp for p in parts for lp in p.logprobs]
        return RolloutOutput([c for p in parts for c in p.completion_ids], logprobs)

    def sync_weights(self, weights: WeightSource, version: int, force: bool = False) -> None:
        self.policy_version = version  # samples from the live policy: never stale

    @torch.no_grad()
    def _generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> RolloutOutput:
        device = next(self.policy.parameters()).device
        ids, mask = left_pad(prompt_ids, self.pad_token_id, device)
        was_training = self.policy.training
        self.policy.eval()
        devices = [device] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                out = self.policy.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens,
                    eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
                    return_dict_in_generate=True, output_scores=self.return_logprobs,
                    synced_gpus=world_size() > 1 and is_sharded(self.policy), **_sampling_kwargs(sampling))
        finally:
            self.policy.train(was_training)
        new = out.sequences[:, ids.shape[1]:]
        completions = [cut_at_eos(row, self.eos_token_id) for row in new.tolist()]
        logprobs = None
        if self.return_logprobs:
            scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)
            picked = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1).tolist()
            logprobs = [row[: len(c)] for row, c in zip(picked, completions)]
        return RolloutOutput(completions, logprobs)


def _sampling_kwargs(sampling: SamplingConfig) -> dict:
    if sampling.temperature == 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k or None}
