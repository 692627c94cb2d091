"""`Episode`: one multi-turn rollout (model turns interleaved with tool and environment turns)
and the metrics over a batch of them (docs/agents.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Episode:
    """One trajectory: everything after the prompt, as the learner will see it.

    Args:
        completion_ids: model and tool/environment tokens interleaved, after the prompt.
        model_mask: 1 where the model sampled the token, 0 on tool/environment tokens (which the
            model conditions on but is never trained on).
        logprobs: the engine's log-prob of each token (0.0 on non-model tokens), or None when
            the engine does not report them.
        messages: the episode as chat messages after the prompt (assistant turns as decoded
            text, ``tool`` and ``user`` observation messages), for rewards and logs.
        turns: model turns taken.
        tool_calls: tool calls parsed (malformed ones included).
        tool_failures: calls that failed (malformed, unknown tool, bad arguments, raised, timed out).
        tool_truncations: tool results cut to the toolbox's ``max_chars``.
        truncated: the episode stopped on a budget (``max_new_tokens`` of model tokens, or the
            context length) rather than by the model answering, the environment finishing or
            ``max_turns``.
        env_reward: the sum of the environment's step rewards (None without an environment or
            when it never returned one).

    Examples:
        >>> ep = Episode([5, 6, 7], [1, 0, 1])
        >>> ep.model_tokens, ep.model_token_fraction
        (2, 0.6666666666666666)
    """

    completion_ids: list[int]
    model_mask: list[int]
    logprobs: list[float] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    tool_truncations: int = 0
    truncated: bool = False
    env_reward: float | None = None

    def __post_init__(self) -> None:
        if len(self.model_mask) != len(self.completion_ids) or (
                self.logprobs is not None and len(self.logprobs) != len(self.completion_ids)):
            raise ValueError(f"episode has {len(self.completion_ids)} tokens but a model_mask of "
                             f"{len(self.model_mask)} and logprobs of "
                             f"{None if self.logprobs is None else len(self.logprobs)}: one entry per token is needed")

    @property
    def model_tokens(self) -> int:
        return sum(self.model_mask)

    @property
    def model_token_fraction(self) -> float:
        return self.model_tokens / len(self.completion_ids) if self.completion_ids else 1.0


def episode_metrics(turns: list[int], calls: list[int], failures: list[int], model_tokens: list[int],
                    tokens: list[int], truncations: list[int] | None = None) -> dict[str, float]:
    """TRL's names for a batch of episodes (pass values gathered from every rank).

    ``tools/call_frequency``: tool calls per episode; ``tools/failure_frequency``: failed calls
    per call (0 without calls); ``tools/truncation_frequency``: results cut to the toolbox's
    ``max_chars`` per call (0 without calls); ``turns/mean`` / ``turns/max``: model turns per episode;
    ``completions/model_token_fraction``: model tokens over all completion tokens of the batch.

    Examples:
        >>> episode_metrics([1, 3], [0, 2], [0, 1], [4, 6], [4, 16])["tools/failure_frequency"]
        0.5
    """
    n, total_calls = max(len(turns), 1), sum(calls)
    return {
        "tools/call_frequency": total_calls / n,
        "tools/failure_frequency": sum(failures) / total_calls if total_calls else 0.0,
        "tools/truncation_frequency": sum(truncations or []) / total_calls if total_calls else 0.0,
        "turns/mean": sum(turns) / n,
        "turns/max": float(max(turns, default=0)),
        "completions/model_token_fraction": sum(model_tokens) / max(sum(tokens), 1),
    }
