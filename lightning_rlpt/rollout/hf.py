"""`HFGenerateEngine`: the default rollout engine, ``transformers.generate`` on the policy itself."""
from __future__ import annotations

import torch
from torch import nn
from transformers import (LogitsProcessor, LogitsProcessorList, MinPLogitsWarper,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from ..model.distributed import is_sharded, run_as_root_forward, world_size
from ..padding import left_pad
from .engine import RolloutEngine, RolloutOutput, WeightSource, cut_at_eos
from .sampling.generation_kwargs import check_hf_kwargs
from .sampling.per_row import RowSampler, request_seeds
from .sampling import SamplingConfig


class HFGenerateEngine(RolloutEngine):
    """``transformers.generate`` on the policy itself (always on-policy, no weight copy).

    Every row samples with its own seed (`per_row.request_seeds`, as the vLLM engines do)
    through `per_row.RowSampler` (inverse-CDF sampling), so a completion depends only on its row's
    seed and prompt: never on the other rows, on ``SamplingConfig.max_batch_rows`` chunks, on
    micro-batching or on the rank layout. No torch RNG is used: the global stream is untouched
    and a resumed run samples exactly what an uninterrupted one does. ``SamplingConfig.min_p``
    is transformers' ``MinPLogitsWarper``; ``repetition_penalty`` is `RepetitionPenalty`, which,
    as vLLM does, leaves each row's left padding out. ``SamplingConfig.generation_kwargs`` go to
    ``generate`` (its processors, e.g. ``no_repeat_ngram_size``, run before the warpers).

    Args:
        policy: the Hugging Face causal LM being trained (LoRA/QLoRA wrappers included).
        eos_token_id / pad_token_id: the tokenizer's ids.
        return_logprobs: also report behaviour log-probs: those of the processed distribution
            each token was drawn from, without the sampling noise (off by default since this
            engine *is* the policy).
    """

    def __init__(self, policy: nn.Module, eos_token_id: int, pad_token_id: int, return_logprobs: bool = False):
        self.policy = policy
        self.policy_version = 0
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.return_logprobs = return_logprobs

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        seeds = request_seeds(seed, len(prompt_ids))
        step = sampling.max_batch_rows or max(len(prompt_ids), 1)
        parts = [self._generate(prompt_ids[a:a + step], sampling, seeds[a:a + step])
                 for a in range(0, len(prompt_ids), step)]
        for _ in range(agreed_count(len(parts), self.policy) - len(parts)):  # FSDP2: every rank calls as often
            self._generate(prompt_ids[:1], sampling, seeds[:1])
        logprobs = None if not self.return_logprobs else [lp for p in parts for lp in p.logprobs]
        return RolloutOutput([c for p in parts for c in p.completion_ids], logprobs)

    def sync_weights(self, weights: WeightSource, version: int, force: bool = False) -> None:
        self.policy_version = version  # samples from the live policy: never stale

    @torch.no_grad()
    def _generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: list[int]) -> RolloutOutput:
        device = next(self.policy.parameters()).device
        ids, mask = left_pad(prompt_ids, self.pad_token_id, device)
        sampler = RowSampler(seeds if sampling.temperature > 0 else None, ids.shape[1], self.return_logprobs)
        sharded = is_sharded(self.policy)
        out = _eval_generate(self.policy, sharded, input_ids=ids, attention_mask=mask,
                             max_new_tokens=sampling.max_new_tokens, eos_token_id=self.eos_token_id,
                             pad_token_id=self.pad_token_id, return_dict_in_generate=True,
                             synced_gpus=world_size() > 1 and sharded, **_sampling_kwargs(sampling, mask, sampler))
        new = out.sequences[:, ids.shape[1]:]
        completions = [cut_at_eos(row, self.eos_token_id) for row in new.tolist()]
        logprobs = None
        if self.return_logprobs:
            picked = torch.stack(sampler.logprobs, dim=1).tolist()
            logprobs = [row[: len(c)] for row, c in zip(picked, completions)]
        return RolloutOutput(completions, logprobs)


def _eval_generate(policy: nn.Module, sharded: bool, **kwargs):
    """``policy.generate(**kwargs)`` in eval mode (its training mode restored after).

    FSDP2 gathers the root unit's own parameters (embeddings, final norm, head) only in hooks
    around the root's forward. A full fine-tune's ``generate`` calls the root itself; a peft
    policy's calls the inner model (``PeftModel.generate`` -> ``base_model.generate``), which met
    sharded embeddings ("mixed torch.Tensor and DTensor"). So a sharded policy generates as a root
    forward (`run_as_root_forward`); nested in it, a full fine-tune's own root calls find the
    parameters gathered.
    """
    was_training = policy.training
    policy.eval()
    try:
        if sharded:
            return run_as_root_forward(policy, lambda: policy.generate(**kwargs))
        return policy.generate(**kwargs)
    finally:
        policy.train(was_training)


def agreed_count(count: int, policy: nn.Module) -> int:
    """The most ``generate`` calls of any rank when the policy is FSDP2-sharded (else ``count``)."""
    if world_size() == 1 or not is_sharded(policy):
        return count
    t = torch.tensor([count], device=next(policy.parameters()).device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t)


class RepetitionPenalty(LogitsProcessor):
    """CTRL's repetition penalty (Keskar et al., arXiv 1909.05858) as vLLM applies it: the logit
    of every token present in the prompt or the completion so far is divided by ``penalty`` when
    positive and multiplied by it otherwise.

    transformers' own ``RepetitionPenaltyLogitsProcessor`` also counts the left padding of a
    batched prompt, so a pad token (often EOS itself) would be penalised in short prompts' rows
    only, and a row's completion would depend on its batch; this one skips the first
    ``pad_lengths[row]`` positions. The engine runs it before the warpers, so the
    order is vLLM's: penalty, temperature, then top-k/top-p/min-p.

    Args:
        penalty: > 0; 1 is a no-op.
        pad_lengths: ``[B]`` left-padding length of each prompt row.

    Examples:
        >>> p = RepetitionPenalty(2.0, torch.tensor([1]))
        >>> p(torch.tensor([[0, 1]]), torch.tensor([[4.0, 4.0, -1.0]])).tolist()  # 0 is padding
        [[4.0, 2.0, -1.0]]
    """

    def __init__(self, penalty: float, pad_lengths: torch.Tensor):
        self.penalty, self.pad_lengths = float(penalty), pad_lengths

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        vocab = scores.shape[-1]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        real = positions.unsqueeze(0) >= self.pad_lengths.to(input_ids.device).unsqueeze(1)
        ids = torch.where(real, input_ids.clamp(max=vocab), vocab)  # padding → a spare column, dropped below
        seen = scores.new_zeros(scores.shape[0], vocab + 1).scatter_(1, ids, 1.0)[:, :vocab].bool()
        penalised = torch.where(scores > 0, scores / self.penalty, scores * self.penalty)
        return torch.where(seen, penalised, scores)


def _sampling_kwargs(sampling: SamplingConfig, attention_mask: torch.Tensor, sampler: RowSampler) -> dict:
    """generate's arguments for ``sampling``: greedy decoding over our own processors (the
    penalty, the warpers, then `RowSampler`, which draws). Model generation-config defaults (a
    checkpoint's own ``repetition_penalty``, ``top_k``, ...) are overridden, never stacked.
    ``generation_kwargs`` are added (their keys cannot collide: `SamplingConfig` refuses those)."""
    processors: list[LogitsProcessor] = []
    if sampling.repetition_penalty != 1:  # ours: transformers' would count the padding
        pads = attention_mask.shape[1] - attention_mask.sum(1)
        processors.append(RepetitionPenalty(sampling.repetition_penalty, pads))
    if sampling.temperature > 0:  # transformers' warpers, in its own order (vLLM's too)
        if sampling.temperature != 1:
            processors.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k:
            processors.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1:
            processors.append(TopPLogitsWarper(sampling.top_p))
        if sampling.min_p:
            processors.append(MinPLogitsWarper(sampling.min_p))
    return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, "min_p": None,
            "repetition_penalty": 1.0, "logits_processor": LogitsProcessorList([*processors, sampler]),
            **check_hf_kwargs(sampling.generation_kwargs)}
