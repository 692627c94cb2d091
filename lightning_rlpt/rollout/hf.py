"""`HFGenerateEngine`: the default rollout engine, ``transformers.generate`` on the policy itself."""
from __future__ import annotations

import torch
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList

from ..model.distributed import is_sharded, world_size
from ..padding import left_pad
from .engine import RolloutEngine, RolloutOutput, WeightSource, cut_at_eos, runs_of_equal
from .sampling import SamplingConfig


class HFGenerateEngine(RolloutEngine):
    """``transformers.generate`` on the policy itself (always on-policy, no weight copy).

    Sampling draws from a private RNG stream seeded by ``seed`` for each call, so the global
    torch RNG is untouched and a resumed run samples exactly what an uninterrupted one does.
    ``SamplingConfig.min_p`` is transformers' ``MinPLogitsWarper``; ``repetition_penalty`` is
    `RepetitionPenalty`, which, as vLLM does, leaves each row's left padding out.

    Args:
        policy: the Hugging Face causal LM being trained (LoRA/QLoRA wrappers included).
        eos_token_id / pad_token_id: the tokenizer's ids.
        return_logprobs: also report behaviour log-probs from generate's scores (costs an
            ``[N, C, V]`` buffer; off by default since this engine *is* the policy).
        max_rows / max_tokens: cut one call into contiguous pieces of at most this many rows and
            padded tokens (``RLModule``'s ``micro_batch_size`` / ``max_tokens_per_micro_batch``).
            A piece after the first samples from a seed derived from the call's, so a cut rollout
            is as random as an uncut one but not token-identical to it.
    """

    def __init__(self, policy: nn.Module, eos_token_id: int, pad_token_id: int, return_logprobs: bool = False,
                 max_rows: int | None = None, max_tokens: int | None = None):
        self.policy = policy
        self.policy_version = 0
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.return_logprobs = return_logprobs
        self.max_rows, self.max_tokens = max_rows, max_tokens

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        seeds = [seed] * len(prompt_ids) if isinstance(seed, int) else seed
        calls = [(a + i, a + j, seeds[a] if i == 0 else derived_seed(seeds[a], i))  # a run's first chunk keeps its seed
                 for a, b in runs_of_equal(seeds) for i, j in self._chunks(prompt_ids[a:b], sampling)]
        parts = [self._generate(prompt_ids[a:b], sampling, s) for a, b, s in calls]
        for _ in range(agreed_count(len(calls), self.policy) - len(calls)):  # FSDP2: every rank calls as often
            self._generate(prompt_ids[:1], sampling, 0)
        logprobs = None if not self.return_logprobs else [lp for p in parts for lp in p.logprobs]
        return RolloutOutput([c for p in parts for c in p.completion_ids], logprobs)

    def _chunks(self, rows: list[list[int]], sampling: SamplingConfig) -> list[tuple[int, int]]:
        """Contiguous ``(start, end)`` chunks within ``max_rows`` rows and ``max_tokens`` padded
        tokens (rows × (widest prompt + ``max_new_tokens``)): the module's micro-batch budget."""
        out, start, widest = [], 0, 0
        for i, row in enumerate(rows):
            wider = max(widest, len(row))
            full = (self.max_rows is not None and i - start + 1 > self.max_rows) or (
                self.max_tokens is not None and (i - start + 1) * (wider + sampling.max_new_tokens) > self.max_tokens)
            if full and i > start:
                out.append((start, i))
                start, wider = i, len(row)
            widest = wider
        return out + [(start, len(rows))]

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
                    synced_gpus=world_size() > 1 and is_sharded(self.policy), **_sampling_kwargs(sampling, mask))
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


def derived_seed(seed: int, offset: int) -> int:
    """The seed of the piece of a call that starts at row ``offset``: pieces must not replay one stream."""
    return (seed * 1_000_003 + 7_919 * offset) % 2**62


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
    ``pad_lengths[row]`` positions. A custom processor runs before generate's warpers, so the
    order is vLLM's: penalty, temperature, then top-k/top-p/min-p.

    Args:
        penalty: > 0; 1 is a no-op.
        pad_lengths: ``[B]`` left-padding length of each prompt row.

    Example:
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


def _sampling_kwargs(sampling: SamplingConfig, attention_mask: torch.Tensor) -> dict:
    """generate's arguments for ``sampling``; model generation-config defaults (a checkpoint's own
    ``repetition_penalty``, ``top_k``, ...) are overridden, never stacked."""
    extra: dict = {"repetition_penalty": 1.0}  # the penalty is ours, below: transformers' would count padding
    if sampling.repetition_penalty != 1:
        pads = attention_mask.shape[1] - attention_mask.sum(1)
        extra["logits_processor"] = LogitsProcessorList([RepetitionPenalty(sampling.repetition_penalty, pads)])
    if sampling.temperature == 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, "min_p": None, **extra}
    return {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k or None, "min_p": sampling.min_p or None, **extra}
