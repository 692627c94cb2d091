"""`rollout_episodes`: `collect.rollout` for multi-turn episodes (step 2 of the walk in
docs/architecture.md when ``RLModule`` has tools, an environment or a ``rollout_func``)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from ...experience import Experience
from ..collect import row_seeds, to_experience, tokenize_prompts
from ..engine import RolloutEngine
from ..sampling import SamplingConfig
from .agent import Agent, as_rollout_output, episode_columns, episode_info


def rollout_episodes(agent: Agent, engine: RolloutEngine, tokenizer: Any, batch: dict[str, list[Any]],
                     group_size: int, sampling: SamplingConfig, seed: int, device: torch.device,
                     seed_per_prompt: bool = False, check_prompts: Callable[[int, int], None] | None = None,
                     max_context: int | None = None) -> tuple[Experience, int]:
    """One episode per row (``group_size`` rows per prompt): environments reset per row, the
    loop (or ``rollout_func``) run, and the episodes packed into an `Experience`: one row per
    trajectory, ``completion_mask`` = the model mask, the decoded whole episode as
    ``completions``, columns ``completion_messages`` / ``env_reward`` for rewards, and the
    per-row episode counts in ``info`` (``turns``, ``tool_calls``, ``tool_failures``,
    ``episode_tokens``). Returns the experience and how many prompts were cut. Arguments as
    `collect.rollout`'s; ``max_context`` bounds prompt + episode tokens (`run_episodes`), and a
    prompt that leaves it no room, or has no tokens, is refused naming its dataset index."""
    sampling = agent.sampling(sampling)
    rows = [{k: batch[k][j] for k in batch} for j in range(len(batch["prompt"])) for _ in range(group_size)]
    envs, prompts = agent.reset(rows, [r["prompt"] for r in rows])
    indices = [r["index"] for r in rows] if "index" in batch else None
    # The loop caps each turn to the context left, so a prompt needs room for one token, not the budget.
    prompt_ids, cut = tokenize_prompts(tokenizer, prompts, sampling, indices, max_context, whole_completion=False)
    if check_prompts is not None:
        check_prompts(max(len(row) for row in prompt_ids), sampling.max_new_tokens)
    seeds = row_seeds(batch, group_size, seed, seed_per_prompt)  # one per row: each row's turns follow its own stream
    episodes = agent.run(engine, tokenizer, prompt_ids, prompts, sampling, seeds, envs, max_context)
    out = as_rollout_output(episodes)
    exp = to_experience(out, prompt_ids, tokenizer, batch, group_size, sampling, device)  # decodes whole episodes
    exp.columns.update(episode_columns(episodes))
    exp.info.update({k: v.to(device) for k, v in episode_info(episodes).items()})
    return exp, cut
