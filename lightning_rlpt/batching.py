"""How a rollout is cut for the update: mini-batches (one optimizer step each) and, inside a
mini-batch, micro-batches (one forward/backward each, gradients accumulated).

A micro-batch holds at most ``micro_batch_size`` sequences and at most
``max_tokens_per_micro_batch`` tokens *as padded*: rows × (its longest prompt + its longest
completion), since each micro-batch is trimmed to its own widths (`Experience.trim`). With
``padding_free`` (one packed row per forward, `model.logprobs.pack`) the budget counts real
tokens: the sum of the rows' lengths. Rows are
grouped by length (longest first) so that short rows share a micro-batch and little padding is
computed. The same split chunks every no-grad forward over an experience (`logprobs_in_chunks`).

A sequence longer than the token budget cannot be split (a causal LM's later tokens need the
earlier ones in the same forward), so it is an error that names the row and its length; the
module checks the worst case (longest prompt + ``max_new_tokens``) before each rollout, so no
rollout is wasted on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from .experience import Experience


@dataclass(frozen=True)
class MicroBatching:
    """Args:
        micro_batch_size: sequences per forward/backward (None: no limit).
        max_tokens_per_micro_batch: tokens per forward/backward (None: no limit), padded ones
            included unless ``padding_free``.
        padding_free: the forwards pack their rows into one row, so only real tokens count.
    """

    micro_batch_size: int | None = None
    max_tokens_per_micro_batch: int | None = None
    padding_free: bool = False

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "max_tokens_per_micro_batch"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None (got {value!r})")

    @property
    def active(self) -> bool:
        return self.micro_batch_size is not None or self.max_tokens_per_micro_batch is not None

    def check_fits(self, longest_prompt: int, max_new_tokens: int) -> None:
        """Fail before a rollout whose longest possible sequence would not fit the budget."""
        budget = self.max_tokens_per_micro_batch
        if budget is not None and longest_prompt + max_new_tokens > budget:
            raise ValueError(
                f"max_tokens_per_micro_batch={budget} is smaller than the longest sequence this rollout can produce: "
                f"a {longest_prompt}-token prompt + max_new_tokens={max_new_tokens} = {longest_prompt + max_new_tokens} "
                "tokens (a sequence cannot be split across micro-batches). Raise max_tokens_per_micro_batch to at least "
                f"{longest_prompt + max_new_tokens}, or lower max_new_tokens / max_prompt_length")

    def split(self, exp: Experience) -> list[torch.Tensor]:
        """Row indices of each micro-batch of ``exp`` (every row exactly once)."""
        prompt_len, completion_len = row_lengths(exp)
        if not self.active:
            return [torch.arange(len(exp))]
        order = torch.argsort(prompt_len + completion_len, descending=True, stable=True).tolist()
        groups: list[list[int]] = []
        widest_prompt = widest_completion = real = 0
        for row in order:
            p, c = int(prompt_len[row]), int(completion_len[row])
            if p + c > (self.max_tokens_per_micro_batch or p + c):
                raise ValueError(f"row {row} has {p + c} tokens ({p} prompt + {c} completion), more than "
                                 f"max_tokens_per_micro_batch={self.max_tokens_per_micro_batch}: raise the budget")
            if groups and self._room(groups[-1], max(widest_prompt, p), max(widest_completion, c), real + p + c):
                groups[-1].append(row)
                widest_prompt, widest_completion, real = max(widest_prompt, p), max(widest_completion, c), real + p + c
            else:
                groups.append([row])
                widest_prompt, widest_completion, real = p, c, p + c
        return [torch.tensor(sorted(g), dtype=torch.long) for g in groups]

    def _room(self, group: list[int], prompt_width: int, completion_width: int, real_tokens: int) -> bool:
        rows = len(group) + 1
        if self.micro_batch_size is not None and rows > self.micro_batch_size:
            return False
        budget = self.max_tokens_per_micro_batch
        tokens = real_tokens if self.padding_free else rows * (prompt_width + completion_width)
        return budget is None or tokens <= budget

    def micro_batches(self, exp: Experience) -> Iterator[Experience]:
        """``exp`` cut into trimmed micro-batches."""
        for rows in self.split(exp):
            yield exp.select(rows).trim()


def row_lengths(exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: real prompt tokens, and completion tokens up to the last trained one (what a
    forward must see; later columns are padding or masked tail)."""
    prompt = exp.prompt_mask.sum(1).cpu()
    mask = exp.completion_mask.cpu() != 0
    positions = torch.arange(1, mask.shape[1] + 1)
    completion = (mask * positions).amax(1) if mask.shape[1] else torch.zeros(len(exp), dtype=torch.long)
    return prompt, completion


def span_mask(exp: Experience) -> torch.Tensor:
    """``[N, P + C]`` 1 on the tokens a forward must see (`row_lengths`): the real prompt, and the
    completion up to its last trained token. What a packed (padding-free) forward runs on; later
    tokens cannot change the log-probs of earlier ones in a causal LM."""
    _, completion = row_lengths(exp)
    positions = torch.arange(exp.completion_ids.shape[1])
    spans = (positions[None] < completion[:, None]).to(exp.prompt_mask)
    return torch.cat([exp.prompt_mask, spans], dim=1)


def minibatch_orders(n: int, size: int | None, passes: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Row indices of each mini-batch: ``passes`` passes over ``n`` rows, shuffled when cut."""
    size = size or n
    for _ in range(passes):
        order = torch.randperm(n, generator=generator) if size < n else torch.arange(n)
        for start in range(0, n, size):
            yield order[start:start + size]


LogprobFn = Callable[[Experience], tuple[torch.Tensor, "torch.Tensor | None"]]


def logprobs_in_chunks(fn: LogprobFn, exp: Experience, batching: MicroBatching,
                       agree: Callable[[int], int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``fn`` (log-probs and optional entropies of an experience's completions) over the
    micro-batches of ``exp``, stitched back into ``[N, C]`` (0 beyond each chunk's trimmed width).

    ``agree`` maps this rank's chunk count to the count every rank must run (FSDP2 gathers
    parameters in each forward): extra forwards on one row are run and discarded."""
    if not batching.active:
        return fn(exp)
    chunks = batching.split(exp)
    n, width = exp.completion_ids.shape
    logp = entropy = None
    for rows in chunks:
        part_logp, part_entropy = fn(exp.select(rows).trim())
        if logp is None:
            logp = part_logp.new_zeros(n, width)
            entropy = None if part_entropy is None else part_entropy.new_zeros(n, width)
        rows = rows.to(logp.device)
        logp = logp.index_put((rows,), _widen(part_logp, width))  # out of place: keeps the graph under grad
        if entropy is not None:
            entropy[rows] = _widen(part_entropy, width)
    for _ in range((agree(len(chunks)) if agree else len(chunks)) - len(chunks)):
        fn(exp.select([0]).trim())
    return logp, entropy


def _widen(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))
