"""`run_episodes`: the multi-turn rollout loop, the same for every `RolloutEngine` (docs/agents.md).

Each turn generates for the rows still running, parses tool calls from the new text, runs the
tools and/or the environment, and appends their messages as the chat template renders them.
The model's own tokens are never re-tokenized: only the template's text *after* the model's
turn (`template.render_suffix`) is tokenized and marked as not-model tokens.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

from ...seeding import keyed_seed
from ..engine import RolloutEngine, runs_of_equal
from ..sampling import SamplingConfig
from .episode import Episode
from .environment import check_step
from .parsing import as_parser
from .template import render_suffix


def turn_seed(seed: int, turn: int) -> int:
    """The seed of a row's ``turn``: turn 0 keeps the row's seed (a one-turn episode samples what
    a plain rollout does); later turns mix in the turn, so rows sharing a seed keep sharing it and
    a run is a function of its seeds alone (`seeding`) (resume and HF/vLLM agreement rest on this)."""
    return seed if turn == 0 else keyed_seed("turn", seed, turn)


def run_episodes(engine: RolloutEngine, tokenizer: Any, prompt_ids: list[list[int]], prompts: Sequence[Any],
                 sampling: SamplingConfig, seeds: int | list[int], *, tools: Any = None,
                 environments: Sequence[Any] | None = None, max_turns: int = 1, parser: Any = None,
                 max_context: int | None = None) -> list[Episode]:
    """Run one episode per prompt row.

    Budgets (both truncate and flag the episode, never raise): ``sampling.max_new_tokens``
    counts the *model* tokens of the whole episode (tool/environment tokens are free, as in
    TRL); ``max_context`` bounds prompt + everything after it (the engine's or model's context
    length): a turn never generates past it and an observation that would leave no room for one
    more model token ends the episode instead. At the last of ``max_turns`` turns the episode
    ends after the model's text: calls in it are counted, not run.

    Args:
        engine: any `RolloutEngine` (HF, vLLM, server).
        tokenizer: the policy's tokenizer (with a chat template when tools or environments are used).
        prompt_ids: the tokenized prompt of each row (generation prompt included).
        prompts: each row's prompt (messages or string): the conversation the template renders.
        sampling: sampling of every turn (``max_new_tokens``: the episode's model-token budget).
        seeds: one seed, or one per row; turn ``t`` uses `turn_seed`.
        tools: a ``ToolBox`` (``.call(ToolCall) -> ToolResult``) or None.
        environments: one environment per row, already ``reset`` (``step(text) -> (observation,
            reward, done)``), or None.
        max_turns: model turns per episode at most.
        parser: ``parse(text) -> ParsedTurn(calls, errors)`` object or callable; the default
            parses Hermes ``<tool_call>`` JSON.
        max_context: prompt + episode tokens at most (None: unbounded).

    Examples:
        >>> episodes = run_episodes(engine, tok, ids, prompts, sampling, 0, tools=box, max_turns=4)  # doctest: +SKIP
    """
    n = len(prompt_ids)
    seeds = [seeds] * n if isinstance(seeds, int) else list(seeds)
    parse = as_parser(parser).parse if tools is not None else None
    episodes = [Episode([], [], []) for _ in range(n)]
    chats = [_as_messages(p) for p in prompts]
    active = list(range(n))
    for turn in range(max_turns):
        limits = {i: _room(episodes[i], len(prompt_ids[i]), sampling.max_new_tokens, max_context) for i in active}
        outs = _generate(engine, [prompt_ids[i] + episodes[i].completion_ids for i in active],
                         [limits[i] for i in active], sampling, [turn_seed(seeds[i], turn) for i in active])
        still = []
        for i, (ids, logprobs) in zip(active, outs):
            if _step(episodes[i], ids, logprobs, tokenizer, chats[i], limits[i], turn + 1 == max_turns,
                     tools, parse, environments[i] if environments else None,
                     len(prompt_ids[i]), sampling.max_new_tokens, max_context, sampling.chat_template_kwargs):
                still.append(i)
        active = still
        if not active:
            break
    return episodes


def _room(ep: Episode, prompt_len: int, budget: int, max_context: int | None) -> int:
    """Model tokens the next turn may sample: the episode's model-token budget and the context both bound it."""
    return min(budget - ep.model_tokens, _context_left(ep, prompt_len, max_context))


def _context_left(ep: Episode, prompt_len: int, max_context: int | None) -> int:
    return 2**62 if max_context is None else max_context - prompt_len - len(ep.completion_ids)


def _generate(engine: RolloutEngine, contexts: list[list[int]], limits: list[int], sampling: SamplingConfig,
              seeds: list[int]) -> list[tuple[list[int], list[float] | None]]:
    """One engine call per run of rows with the same token limit (rows keep their order)."""
    out: list[tuple[list[int], list[float] | None]] = []
    for a, b in runs_of_equal(limits):
        res = engine.generate(contexts[a:b], replace(sampling, max_new_tokens=limits[a]), seeds[a:b])
        lps = res.logprobs or [None] * (b - a)
        out += list(zip(res.completion_ids, lps))
    return out


def _step(ep: Episode, ids: list[int], logprobs: list[float] | None, tokenizer: Any, chat: list[dict],
          limit: int, last_turn: bool, tools: Any, parse: Callable | None, env: Any, prompt_len: int,
          budget: int, max_context: int | None, template_kwargs: dict | None) -> bool:
    """Append one model turn and what answers it; True while the episode goes on."""
    eos = tokenizer.eos_token_id
    ep.turns += 1
    ep.completion_ids += ids
    ep.model_mask += [1] * len(ids)
    if ep.logprobs is not None:
        ep.logprobs = None if logprobs is None else ep.logprobs + list(logprobs)
    text = tokenizer.decode(ids[:-1] if ids and ids[-1] == eos else ids, skip_special_tokens=True)
    ep.messages.append({"role": "assistant", "content": text})
    if not ids or ids[-1] != eos:  # stopped by the token limit: a budget ran out
        ep.truncated = len(ids) >= limit
        return False
    new: list[dict[str, Any]] = []
    if parse is not None:
        new += _tool_messages(ep, parse(text), tools, run=not last_turn)
    done = False
    if env is not None:
        observation, reward, done = check_step(env, env.step(text))
        if reward is not None:
            ep.env_reward = (ep.env_reward or 0.0) + float(reward)
        if not done and observation:
            new.append({"role": "user", "content": observation})
    if done or last_turn or not new:
        return False
    suffix = render_suffix(tokenizer, chat + ep.messages, new, template_kwargs,
                           model_end=tokenizer.eos_token or "")
    if min(budget - ep.model_tokens, _context_left(ep, prompt_len, max_context) - len(suffix)) < 1:
        ep.truncated = True  # no room left for the model to answer the observation
        return False
    ep.messages += new
    ep.completion_ids += suffix
    ep.model_mask += [0] * len(suffix)
    if ep.logprobs is not None:
        ep.logprobs += [0.0] * len(suffix)
    return True


def _tool_messages(ep: Episode, parsed: Any, tools: Any, run: bool) -> list[dict[str, Any]]:
    """Tool messages answering the parsed calls (malformed ones as failed results)."""
    calls, errors = list(parsed.calls), list(parsed.errors)
    ep.tool_calls += len(calls) + len(errors)
    ep.tool_failures += len(errors)
    if not run:
        return []
    out = []
    for call in calls:
        result = tools.call(call)
        ep.tool_failures += int(result.failed)
        ep.tool_truncations += int(getattr(result, "truncated", False))  # a duck-typed result may not say
        out.append({"role": "tool", "name": call.name, "content": result.content})
    out += [{"role": "tool", "content": f"error: {e}"} for e in errors]
    return out


def _as_messages(prompt: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
