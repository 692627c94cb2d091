"""`SamplingConfig`: the generation settings every rollout engine understands."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .generation_kwargs import changed_by, check_generation_kwargs

# Arguments `collect.tokenize_prompts` sets itself when it calls ``apply_chat_template``.
RESERVED_TEMPLATE_KWARGS = ("conversation", "add_generation_prompt", "tokenize", "return_dict")


@dataclass
class SamplingConfig:
    """How completions are sampled (TRL's names; both engines honour every field).

    Args:
        max_new_tokens: generation budget per completion.
        temperature: 0 means greedy (validation only); training needs > 0. Training log-probs
            use the same temperature (as TRL does), so the importance ratio compares like with like.
        top_p: nucleus sampling mass in (0, 1].
        top_k: 0 disables top-k.
        min_p: keep only tokens whose probability (after the temperature) is at least
            ``min_p`` × the most likely token's (Nguyen et al., "Turning Up the Heat: Min-p
            Sampling", arXiv 2407.01082); 0 disables it, 1 keeps only the argmax. In [0, 1].
        repetition_penalty: CTRL's penalty (Keskar et al., arXiv 1909.05858) on every token
            already in the prompt or the completion so far: its logit is divided by the penalty
            when positive, multiplied when negative. 1 disables it; > 1 discourages repeats,
            < 1 encourages them. Applied before the temperature, in greedy decoding too.
        max_prompt_length: prompts longer than this many tokens (after the chat template) are
            handled by ``prompt_truncation``. None (the default, as TRL): no prompt is ever cut,
            and one the context cannot hold with its completion is refused, naming it, before
            generation (`prompt_checks`). No cut by default because a cut silently changes the
            task: it drops the prompt's beginning (the instructions, the few-shot examples). vLLM
            engines size their context from it: with None they take the model's whole context
            (``max_position_embeddings``); set it, or the engine's ``max_model_len``, to bound that.
        prompt_truncation: what a prompt longer than ``max_prompt_length`` gets: ``"left"`` keeps
            its last ``max_prompt_length`` tokens, counted in ``prompts/truncated``, with a warning
            (count, limit, remedy) on the first batch that has one; ``"error"`` stops before any
            rollout.
        chat_template: format string prompts with the tokenizer's chat template (as one user
            turn) when it has one; False feeds them raw. Conversational prompts (lists of
            ``{"role", "content"}`` messages) always go through the template.
        chat_template_kwargs: extra variables for ``tokenizer.apply_chat_template`` (TRL's
            name), e.g. ``{"enable_thinking": False}`` for Qwen3's non-thinking mode. The
            validation config copies the training one (``RLModule(val_generation=None)``), so
            validation prompts are formatted the same way; an explicit ``val_generation`` must
            repeat it.
        max_batch_rows: the HF engine generates at most this many rows per ``generate`` call
            (its memory is the KV cache and one step's logits, both in proportion to the rows);
            None (the default): one call for the whole rollout. Completions do not depend on it
            (each row samples with its own seed). The training caps (``RLModule``'s
            ``micro_batch_size`` / ``max_tokens_per_micro_batch``) never chunk generation: small
            chunks re-read the whole model at every decoding step. vLLM engines schedule their
            own batches and ignore it. See docs/memory.md.
        generation_kwargs: extra keyword arguments for the engine's sampler (TRL's name):
            ``transformers.generate`` (HF engine) or vLLM's ``SamplingParams`` / completions
            request, e.g. ``{"no_repeat_ngram_size": 3}``. Keys this config or the rollout already
            sets are refused naming what to use instead (`rollout.sampling.generation_kwargs`); TRL lets
            them override. Validation copies them with the rest of the training config.

    What the learner scores: the training log-probs are ``log_softmax(logits / temperature)``
    of the policy, not of the distribution ``top_p``, ``top_k``, ``min_p`` and
    ``repetition_penalty`` (and ``generation_kwargs``) sample from (TRL does the same). With the
    defaults the two are one; otherwise `distribution_changes` names the settings that differ. Engines that report
    behaviour log-probs report those of the distribution really sampled from (vLLM's
    ``processed_logprobs``, generate's processed scores), so the importance ratio and the
    mismatch correction then carry that difference too (see docs/long_reasoning.md).

    Examples:
        >>> SamplingConfig(max_new_tokens=256, min_p=0.05, repetition_penalty=1.1,
        ...                chat_template_kwargs={"enable_thinking": False}).distribution_changes()
        ['min_p=0.05', 'repetition_penalty=1.1']
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_prompt_length: int | None = None
    prompt_truncation: str = "left"
    chat_template: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    max_batch_rows: int | None = None
    generation_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, 0 meaning greedy (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, 0 disables it (got {self.top_k})")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], 0 disabling it (got {self.min_p}); 0.05-0.1 is usual")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, 1 disabling it (got {self.repetition_penalty}); "
                             "> 1 discourages repeated tokens, 1.05-1.2 is usual")
        if self.prompt_truncation not in ("left", "error"):
            raise ValueError(f"prompt_truncation must be 'left' or 'error' (got {self.prompt_truncation!r})")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1 or None (got {self.max_prompt_length})")
        if self.max_batch_rows is not None and (isinstance(self.max_batch_rows, bool) or
                                                not isinstance(self.max_batch_rows, int) or self.max_batch_rows < 1):
            raise ValueError(f"max_batch_rows must be an int >= 1, or None for one generate call (got "
                             f"{self.max_batch_rows!r}); it caps the HF engine's rows per call")
        self._check_template_kwargs()
        check_generation_kwargs(self.generation_kwargs)

    def _check_template_kwargs(self) -> None:
        kwargs = self.chat_template_kwargs
        if kwargs is None:
            return
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"chat_template_kwargs must be a dict of variable names to values, e.g. "
                             f"{{'enable_thinking': False}} (got {kwargs!r})")
        reserved = sorted(set(kwargs) & set(RESERVED_TEMPLATE_KWARGS))
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {reserved}: the prompt tokenizer sets "
                             f"{list(RESERVED_TEMPLATE_KWARGS)} itself; drop them (use chat_template=False for raw prompts)")

    def distribution_changes(self) -> list[str]:
        """The settings under which completions are not drawn from the policy's tempered
        distribution, which the learner's log-probs describe (empty with the defaults)."""
        changed = {"repetition_penalty": self.repetition_penalty != 1}
        if self.temperature > 0:  # truncations never change a greedy choice
            changed = {"top_p": self.top_p < 1, "top_k": self.top_k > 0, "min_p": self.min_p > 0, **changed}
        named = [f"{name}={getattr(self, name)}" for name, on in changed.items() if on]
        return named + changed_by(self.generation_kwargs)

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
