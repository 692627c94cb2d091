"""Prompts refused before a rollout, on every engine: a prompt of no tokens, and one that leaves
the model's context no room for its completion.

Why here and not in the engines: vLLM refuses both itself, but ``transformers.generate`` does
not. An empty prompt (a tokenizer that adds no BOS) generates from a fully masked context, or
crashes inside ``generate`` when the whole batch is empty; a prompt past the model's positions
trains on positions the model never learnt, silently.
"""
from __future__ import annotations

from typing import Any, Sequence


def check_prompt_rows(rows: Sequence[Sequence[int]], prompts: Sequence[Any], max_new_tokens: int,
                      indices: Sequence[Any] | None = None, max_context: int | None = None,
                      whole_completion: bool = True) -> None:
    """Refuse, with a ValueError naming the first bad row, a prompt of no tokens and (with
    ``max_context``) one whose tokens leave too little room: ``max_new_tokens`` of it for a
    plain rollout, one token for an episode (whose loop caps each turn to the context left).

    Args:
        rows: each prompt's token ids, after the template and ``max_prompt_length``.
        prompts: the prompts as given (quoted in the message).
        max_new_tokens: the completion budget.
        indices: each row's dataset index, to name it (else its position in the batch).
        max_context: the most tokens prompt and completion may take together (the engine's
            ``max_model_len`` or the model's ``max_position_embeddings``); None: unchecked.
        whole_completion: whether the whole budget must fit after the prompt (plain rollouts)
            or one token (episodes).

    Examples:
        >>> check_prompt_rows([[1, 5], [1, 6, 7]], ["a", "bc"], max_new_tokens=4, indices=[10, 11], max_context=6)
        Traceback (most recent call last):
        ...
        ValueError: prompt at dataset index 11 (row 1 of the batch) has 3 tokens; with max_new_tokens=4 that is 7, beyond the model's context of 6 tokens (1 such prompt in this batch): 'bc'. Shorten it, lower max_new_tokens, or set max_prompt_length=2 (generation=dict(max_prompt_length=...)) to keep its last tokens
    """
    empty = [i for i, row in enumerate(rows) if len(row) == 0]
    if empty:
        i = empty[0]
        raise ValueError(f"prompt {_row_name(i, indices)} is {prompts[i]!r:.80}, which gives no tokens: the tokenizer adds "
                         f"no BOS token, so the model would generate from an empty context ({len(empty)} such rows in "
                         "this batch). Drop or fill such prompts, or use a tokenizer that adds a BOS token or has a "
                         "chat template")
    if max_context is None:
        return
    room = max_new_tokens if whole_completion else 1
    over = [i for i, row in enumerate(rows) if len(row) + room > max_context]
    if over:
        i, n = over[0], len(rows[over[0]])
        what = (f"with max_new_tokens={max_new_tokens} that is {n + room}, beyond" if whole_completion
                else "leaving no room for the episode in")
        fix = (f"Shorten it, lower max_new_tokens, or set max_prompt_length={max_context - room} "
               "(generation=dict(max_prompt_length=...)) to keep its last tokens" if max_context > room
               else f"Lower max_new_tokens below {max_context}")
        raise ValueError(f"prompt {_row_name(i, indices)} has {n} tokens; {what} the model's context of {max_context} "
                         f"tokens ({len(over)} such prompt{'s' if len(over) > 1 else ''} in this batch): "
                         f"{str(prompts[i])[:80]!r}. {fix}")


def _row_name(i: int, indices: Sequence[Any] | None) -> str:
    """Row ``i`` of a batch, named by its dataset index when known (``indices``), for messages."""
    return f"at dataset index {indices[i]} (row {i} of the batch)" if indices is not None else f"{i} of the batch"
