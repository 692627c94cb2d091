"""`SamplingConfig`: the generation settings every rollout engine understands."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class SamplingConfig:
    """How completions are sampled.

    Args:
        max_new_tokens: generation budget per completion.
        temperature: 0 means greedy (validation only); training needs > 0. Training log-probs use the same temperature (as TRL does), so the
            importance ratio compares like with like.
        top_p: nucleus sampling mass in (0, 1].
        top_k: 0 disables top-k.
        max_prompt_length: prompts longer than this (in tokens) are handled by
            ``prompt_truncation``; None means no limit.
        prompt_truncation: ``"left"`` keeps the last ``max_prompt_length`` tokens and counts it
            in ``prompts/truncated``; ``"error"`` stops before any rollout.
        chat_template: format string prompts with the tokenizer's chat template (as one user
            turn) when it has one; False feeds them raw. Conversational prompts (lists of
            ``{"role", "content"}`` messages) always go through the template.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_length: int | None = 512
    prompt_truncation: str = "left"
    chat_template: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, 0 meaning greedy (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, 0 disables it (got {self.top_k})")
        if self.prompt_truncation not in ("left", "error"):
            raise ValueError(f"prompt_truncation must be 'left' or 'error' (got {self.prompt_truncation!r})")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1 or None (got {self.max_prompt_length})")

    @classmethod
    def coerce(cls, value: "SamplingConfig | dict[str, Any] | None") -> "SamplingConfig":
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        known = {f.name for f in fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"unknown generation option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
