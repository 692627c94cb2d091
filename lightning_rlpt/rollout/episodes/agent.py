"""`Agent`: what `RLModule(tools=..., environment=..., rollout_func=...)` configures, and the one
call the rollout path makes to turn a batch into episodes (docs/agents.md)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import torch

from ..engine import RolloutEngine, RolloutOutput
from ..sampling import SamplingConfig
from .episode import Episode, episode_metrics
from .environment import check_reset, make_environment
from .loop import run_episodes
from .parsing import as_parser
from .tools import DEFAULT_MAX_CHARS, ToolBox

DEFAULT_MAX_TURNS = 10


class Agent:
    """Tools, an environment factory or a ``rollout_func``, and the loop's knobs.

    Args:
        tools: Python functions (type hints + docstring) or ``Tool`` objects, or a ``ToolBox``.
        max_turns: model turns per episode at most; None: 10 with tools or an environment.
        tool_timeout: seconds a tool call may take before it is abandoned (a failed call).
        tool_max_chars: characters of a tool result the model reads back (default 10,000); a
            longer one is cut in the middle, with a note, and counted in
            ``tools/truncation_frequency``. None: no cap. Both apply to tools given as functions;
            a ``ToolBox`` keeps its own.
        tool_parser: ``parse(text) -> ParsedTurn`` object or callable; None: Hermes ``<tool_call>``.
        environment: a class or zero-argument callable giving a fresh environment per episode
            (``reset(row) -> str``, ``step(text) -> (observation, reward, done)``).
        rollout_func: ``(prompts, engine, tokenizer, sampling, seeds) -> list[Episode]``, the
            escape hatch for anything the loop cannot express (replaces the loop).

    Examples:
        >>> Agent().active
        False
    """

    def __init__(self, tools: Any = None, max_turns: int | None = None, tool_timeout: float = 10.0,
                 tool_parser: Any = None, environment: Callable[[], Any] | None = None,
                 rollout_func: Callable[..., list[Episode]] | None = None,
                 tool_max_chars: int | None = DEFAULT_MAX_CHARS):
        self.toolbox = _toolbox(tools, tool_timeout, tool_max_chars)
        self.environment, self.rollout_func, self.parser = environment, rollout_func, as_parser(tool_parser)
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"max_turns must be an int >= 1 (got {max_turns!r}): the model turns an episode may take")
        if environment is not None and not callable(environment):
            raise TypeError(f"environment must be a class or a zero-argument callable returning a fresh environment "
                            f"per episode (got {type(environment).__name__})")
        multi = self.toolbox is not None or environment is not None
        self.max_turns = max_turns if max_turns is not None else (DEFAULT_MAX_TURNS if multi else 1)
        self.active = multi or rollout_func is not None or self.max_turns > 1

    def check(self, tokenizer: Any) -> None:
        """Refuse, before any rollout, a chat template that cannot render tool messages."""
        if self.toolbox is not None:
            from .template import check_tools_template
            check_tools_template(tokenizer, self.toolbox.schemas)

    def sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        """``sampling`` with the tools' schemas passed to the chat template (``tools=``)."""
        if self.toolbox is None:
            return sampling
        return replace(sampling, chat_template_kwargs={**(sampling.chat_template_kwargs or {}),
                                                       "tools": self.toolbox.schemas})

    def reset(self, rows: list[dict[str, Any]], prompts: list[Any]) -> tuple[list[Any], list[Any]]:
        """A fresh environment per row, reset on the row; its first observation (when not empty)
        is appended to the prompt as a user message. Returns (environments, prompts)."""
        if self.environment is None:
            return [], prompts
        envs, out = [], []
        for row, prompt in zip(rows, prompts):
            env = make_environment(self.environment)
            observation = check_reset(env, env.reset(row))
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            out.append(messages + [{"role": "user", "content": observation}] if observation else prompt)
            envs.append(env)
        return envs, out

    def run(self, engine: RolloutEngine, tokenizer: Any, prompt_ids: list[list[int]], prompts: list[Any],
            sampling: SamplingConfig, seeds: int | list[int], environments: Sequence[Any],
            max_context: int | None) -> list[Episode]:
        if self.rollout_func is not None:
            episodes = self.rollout_func(prompts, engine, tokenizer, sampling, seeds)
            if len(episodes) != len(prompts) or not all(isinstance(e, Episode) for e in episodes):
                raise TypeError(f"rollout_func must return one Episode per prompt row ({len(prompts)}), got "
                                f"{len(episodes)} items of types {sorted({type(e).__name__ for e in episodes})}")
            return episodes
        return run_episodes(engine, tokenizer, prompt_ids, prompts, sampling, seeds, tools=self.toolbox,
                            environments=environments or None, max_turns=self.max_turns, parser=self.parser,
                            max_context=max_context)


def as_rollout_output(episodes: list[Episode]) -> RolloutOutput:
    """The episodes as the engine-level record `collect.to_experience` reads."""
    logprobs = None if any(e.logprobs is None for e in episodes) else [e.logprobs for e in episodes]
    return RolloutOutput([e.completion_ids for e in episodes], logprobs,
                         model_mask=[e.model_mask for e in episodes], truncated=[e.truncated for e in episodes])


def episode_columns(episodes: list[Episode]) -> dict[str, list[Any]]:
    """Per-row columns reward functions receive: ``completion_messages`` (the episode after the
    prompt, as messages) and ``env_reward`` (None without an environment reward)."""
    return {"completion_messages": [e.messages for e in episodes], "env_reward": [e.env_reward for e in episodes]}


def episode_info(episodes: list[Episode]) -> dict[str, torch.Tensor]:
    """Per-row counts kept in ``Experience.info`` (they follow rows through select/filter/concat)
    for `episode_metrics`."""
    def t(values):
        return torch.tensor(values, dtype=torch.long)
    return {"turns": t([e.turns for e in episodes]), "tool_calls": t([e.tool_calls for e in episodes]),
            "tool_failures": t([e.tool_failures for e in episodes]),
            "tool_truncations": t([e.tool_truncations for e in episodes]),
            "episode_tokens": t([len(e.completion_ids) for e in episodes])}


def info_metrics(info: dict[str, torch.Tensor], model_tokens: torch.Tensor) -> dict[str, float]:
    """`episode_metrics` from an experience's ``info`` and its completion mask's row sums."""
    return episode_metrics(info["turns"].tolist(), info["tool_calls"].tolist(), info["tool_failures"].tolist(),
                           model_tokens.tolist(), info["episode_tokens"].tolist(), info["tool_truncations"].tolist())


def _toolbox(tools: Any, timeout: float, max_chars: int | None) -> Any:
    if tools is None or (isinstance(tools, (list, tuple)) and not tools):
        return None
    if hasattr(tools, "call") and hasattr(tools, "schemas"):
        return tools
    return ToolBox(list(tools), timeout=timeout, max_chars=max_chars)
