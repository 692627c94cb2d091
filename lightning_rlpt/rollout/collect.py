"""From a batch of prompts to a scored `Experience` (steps 2-3 of the walk in docs/architecture.md)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..experience import Experience
from ..padding import left_pad, right_pad
from ..seeding import keyed_seed
from .engine import RolloutEngine, RolloutOutput
from .prompt_checks import check_prompt_rows
from .sampling import SamplingConfig


def tokenize_prompts(tokenizer: Any, prompts: list[Any], sampling: SamplingConfig, indices: list[Any] | None = None,
                     max_context: int | None = None, whole_completion: bool = True) -> tuple[list[list[int]], int]:
    """Token ids of each prompt and how many were cut (from the left) to ``max_prompt_length``.

    Conversational prompts (lists of ``{"role", "content"}`` dicts, as in TRL) always go through
    ``tokenizer.apply_chat_template(add_generation_prompt=True)``; string prompts do too when the
    tokenizer has a chat template and ``sampling.chat_template`` is on; the template also gets
    ``sampling.chat_template_kwargs`` (e.g. ``enable_thinking=False``). Reward functions still
    receive the original prompts. A prompt of no tokens, or (given ``max_context``) one that leaves
    no room for its completion, is refused naming its row: its dataset index from ``indices``
    (`prompt_checks.check_prompt_rows`, which explains ``whole_completion``)."""
    ids = [_prompt_ids(tokenizer, p, sampling.chat_template, sampling.chat_template_kwargs) for p in prompts]
    limit = sampling.max_prompt_length
    too_long = [i for i, row in enumerate(ids) if limit is not None and len(row) > limit]
    if too_long and sampling.prompt_truncation == "error":
        i = too_long[0]
        raise ValueError(f"prompt {i} has {len(ids[i])} tokens, more than max_prompt_length={limit} "
                         f"({len(too_long)} such prompts in this batch): {str(prompts[i])[:80]!r}. Raise max_prompt_length "
                         "or set prompt_truncation='left' to keep the last tokens")
    ids = [row[-limit:] for row in ids] if limit is not None else ids
    check_prompt_rows(ids, prompts, sampling.max_new_tokens, indices, max_context, whole_completion)
    return ids, len(too_long)


def truncation_warning(cut: int, prompts: int, limit: int, where: str) -> str:
    """The warning for the first batch whose prompts ``max_prompt_length`` cut (`tokenize_prompts`):
    how many, the limit and the ways out. ``where`` says which batch (step, rank)."""
    return (f"max_prompt_length={limit} cut {cut} of the {prompts} prompts of a batch ({where}) to their last {limit} "
            "tokens: a cut prompt loses its beginning (instructions, few-shot examples), which changes the task. "
            "Raise it, or set generation=dict(max_prompt_length=None) to cut nothing (a prompt the context cannot "
            "hold is still refused before generation), or prompt_truncation='error' to stop instead. Training "
            "batches count cut prompts in the prompts/truncated metric; this warning is not repeated")


def _prompt_ids(tokenizer: Any, prompt: Any, use_template: bool, template_kwargs: dict[str, Any] | None = None
                ) -> list[int]:
    if isinstance(prompt, str) and not (use_template and getattr(tokenizer, "chat_template", None)):
        return tokenizer(prompt, add_special_tokens=True)["input_ids"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"conversational prompt {str(messages)[:80]!r} needs a chat template, but the tokenizer has "
                         "none: set tokenizer.chat_template (a Jinja string) or give plain string prompts")
    # The template writes the special tokens (BOS, role markers) itself, as TRL does.
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {}))
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def rollout(engine: RolloutEngine, tokenizer: Any, batch: dict[str, list[Any]], group_size: int,
            sampling: SamplingConfig, seed: int, device: torch.device,
            seed_per_prompt: bool = False, check_prompts: Callable[[int, int], None] | None = None,
            max_context: int | None = None) -> tuple[Experience, int]:
    """Sample ``group_size`` completions per prompt; returns the experience and the count of
    truncated prompts. Each row samples from its own seed (`row_seeds`); with ``seed_per_prompt``
    it comes from ``seed`` and the prompt's dataset ``index``, so samples do not depend on batch
    composition or layout.
    ``check_prompts(longest prompt, max_new_tokens)`` may refuse the batch before generation, as
    ``max_context`` refuses a prompt that leaves no room for ``max_new_tokens`` (`tokenize_prompts`).
    (Multi-turn episodes: `episodes.rollout.rollout_episodes`, same arguments.)"""
    prompts = list(batch["prompt"])
    prompt_ids, cut = tokenize_prompts(tokenizer, prompts, sampling, batch.get("index"), max_context)
    if check_prompts is not None:
        check_prompts(max(len(row) for row in prompt_ids), sampling.max_new_tokens)
    rep = [row for row in prompt_ids for _ in range(group_size)]
    out = engine.generate(rep, sampling, row_seeds(batch, group_size, seed, seed_per_prompt))
    return to_experience(out, rep, tokenizer, batch, group_size, sampling, device), cut


def row_seeds(batch: dict[str, list[Any]], group_size: int, seed: int, seed_per_prompt: bool) -> list[int]:
    """One seed per row, every row its own: keyed by ``(seed, row)``, or with ``seed_per_prompt``
    by ``(seed, dataset index, occurrence of that index in the batch, row within the group)``,
    so a prompt drawn twice gets two independent groups and no seed depends on the prompt's
    position in the batch. Engines sample each row from its seed alone (`sampling.per_row`)."""
    if not seed_per_prompt:
        return [keyed_seed("row", seed, j) for j in range(len(batch["prompt"]) * group_size)]
    if "index" not in batch:
        raise ValueError("seed_per_prompt=True keys each prompt's seed by its dataset index, but the batch has "
                         "no 'index' column: load prompts with PromptDataModule (or collate_prompts), or set "
                         "seed_per_prompt=False")
    seen: dict[int, int] = {}
    seeds = []
    for i in batch["index"]:
        occurrence = seen[int(i)] = seen.get(int(i), -1) + 1
        seeds += [keyed_seed("prompt", seed, int(i), occurrence, k) for k in range(group_size)]
    return seeds


def to_experience(out: RolloutOutput, prompt_rows: list[list[int]], tokenizer: Any, batch: dict[str, list[Any]],
                  group_size: int, sampling: SamplingConfig, device: torch.device) -> Experience:
    n = len(prompt_rows)
    if len(out.completion_ids) != n:
        raise RuntimeError(f"rollout engine returned {len(out.completion_ids)} completions for {n} prompt rows")
    prompt_ids, prompt_mask = left_pad(prompt_rows, tokenizer.pad_token_id)
    comp = out.completion_ids
    eos = tokenizer.eos_token_id
    width = max(1, max(len(c) for c in comp))
    completion_ids = right_pad(comp, tokenizer.pad_token_id, torch.long, width)
    # Tool/environment tokens of an episode: in the sequence, out of the loss (model_mask 0).
    masks = out.model_mask if out.model_mask is not None else [[1] * len(c) for c in comp]
    completion_mask = right_pad(masks, 0, torch.long, width)
    truncated = torch.tensor(out.truncated if out.truncated is not None else [len(c) == 0 or c[-1] != eos for c in comp])
    behaviour = right_pad(out.logprobs, 0.0, torch.float32, width) if out.logprobs is not None else None
    texts = tokenizer.batch_decode([c[:-1] if c and c[-1] == eos else c for c in comp], skip_special_tokens=True)
    columns = {k: [v for v in vals for _ in range(group_size)] for k, vals in batch.items() if k != "prompt"}
    prompts = [p for p in batch["prompt"] for _ in range(group_size)]
    exp = Experience(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
        completion_mask=completion_mask, group_ids=torch.arange(n // group_size).repeat_interleave(group_size),
        group_size=group_size, prompts=prompts, completions=texts, columns=columns, truncated=truncated,
        behaviour_logprobs=behaviour,
    )
    return exp.to(device)


def rollout_metrics(rewards: torch.Tensor, per_func: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor,
                    group_size: int, names: list[str], failures: torch.Tensor) -> dict[str, float]:
    """TRL's names for what a rollout looked like, with TRL's meanings (pass tensors gathered
    from every rank; docs/metrics.md lists each).

    ``reward_std`` is the (unbiased) std over the whole batch, as TRL's ``nanstd(rewards)``;
    ``reward_group_std`` the mean of the per-group stds (the spread GRPO learns from);
    ``frac_reward_zero_std`` the share of groups whose std is 0. Per function:
    ``rewards/<name>/mean`` and ``std`` over the samples it applies to (not None, as TRL's
    ``nanmean``/``nanstd``; left out when it applied to none), ``none_frac`` (the share of
    samples it returned None for) and ``failures`` (samples scored 0 under
    ``reward_on_error="zero"``). Lengths: `length_metrics`."""
    group_std = rewards.view(-1, group_size).std(dim=1)
    out = {
        "reward": rewards.mean().item(),
        "reward_std": rewards.std().item(),
        "reward_group_std": group_std.mean().item(),
        "frac_reward_zero_std": (group_std < 1e-6).float().mean().item(),
        **length_metrics(lengths, truncated),
    }
    for j, name in enumerate(names):
        col = per_func[:, j]
        applied = col[~torch.isnan(col)]
        if len(applied):
            out[f"rewards/{name}/mean"] = applied.mean().item()
            out[f"rewards/{name}/std"] = applied.std().item() if len(applied) > 1 else 0.0
        out[f"rewards/{name}/none_frac"] = 1.0 - len(applied) / max(len(col), 1)
        out[f"rewards/{name}/failures"] = float(failures[j])
    return out


def length_metrics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """``completions/{mean,min,max}_length`` over every completion, ``clipped_ratio`` (the share
    that did not end with EOS) and ``{mean,min,max}_terminated_length`` over those that did; all
    three are 0 when none did (TRL's ``_generate_and_score_completions`` logs its
    ``torch.zeros(1)`` then).

    Args:
        lengths: ``[N]`` model tokens of each completion (EOS counted; an episode's tool tokens not).
        truncated: ``[N]`` bool, True where the completion did not end with EOS.
    """
    lengths = lengths.float()
    ended = lengths[~truncated.bool()]
    ended = ended if len(ended) else lengths.new_zeros(1)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": ended.mean().item(),
        "completions/min_terminated_length": ended.min().item(),
        "completions/max_terminated_length": ended.max().item(),
    }
