"""`MakeExperience`: RLModule's rollout → rewards → log-probs → advantages (steps 2-4 of the walk),
with the RL hooks in between and each stage timed (``timing/*``)."""
from __future__ import annotations

import warnings
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from ..algorithms.advantages import compute_advantages, estimator_fields
from ..algorithms.correction import mismatch_metrics
from ..batching import logprobs_in_chunks, span_mask
from ..experience import Experience
from ..hooks import call_hook
from ..model.loading import reference_context
from ..model.distributed import reduce_over_ranks
from ..model.logprobs import completion_logprobs
from ..model.reference import onloaded
from ..model.weights import policy_weights
from ..rewards import TrainerState, score_experience
from ..rollout import collect
from ..rollout.contract import check_engine, check_held_version, check_synced, staleness_metrics
from ..rollout.episodes.agent import info_metrics
from ..rollout.episodes.rollout import rollout_episodes
from ..rollout.parity import low_precision
from ..rollout.pipeline import RolloutPipeline
from .fit_state import FitState

if TYPE_CHECKING:  # the annotations of what the stage reads (`MakeExperience`'s surface)
    from ..algorithms.presets import Objective
    from ..batching import MicroBatching
    from ..knobs import Requests
    from ..rewards import RewardFunctions
    from ..rollout import RolloutEngine, SamplingConfig
    from ..rollout.episodes import Agent
    from ..rollout.parity import ParityProbe
    from .timing import StepTimer


class MakeExperience:
    """Mixin of `RLModule` (which supplies the engine, rewards, models and hyper-parameters)."""

    # What this stage reads of the module besides Lightning's own attributes: set by `RLModule`
    # (or, for `loss_mask`, by `PolicyUpdate`). tests/meta/test_stage_surfaces.py checks that the
    # stage touches nothing else and that nothing listed is unused.
    EXPERIENCE_SETTINGS = ("minibatch_size", "seed_per_prompt", "updates_per_rollout", "use_fused_kernel")
    policy: nn.Module
    reference: nn.Module | None
    use_reference: bool
    tokenizer: Any
    engine: RolloutEngine
    sampling: SamplingConfig
    agent: Agent
    rewards: RewardFunctions
    objective: Objective
    group_size: int
    advantage_kwargs: dict[str, Any]
    micro_batching: MicroBatching
    requests: Requests
    parity: ParityProbe
    timer: StepTimer
    policy_version: int
    _agree_count: Callable[[int], int]
    _log_dict: Callable[..., None]
    _next_seed: Callable[[], int]
    loss_mask: Callable[[Experience], torch.Tensor]

    # Prompt + completion tokens of every training rollout so far, all ranks (checkpointed).
    tokens_seen: int = 0

    # Set by the first rollout whose prompts max_prompt_length cut (`sample` warns once).
    _warned_prompt_cut: bool = False

    fit_state: FitState  # what each fit starts afresh (`fit_state.py`): here, the no-signal watch

    def make_experience(self, batch: dict[str, list[Any]]) -> Experience | None:
        """Rollout → rewards → log-probs → advantages, with the RL hooks in between."""
        exp, failures, cut = self.rollout_and_score(batch, self._next_seed())
        self._log_rollout(exp, failures, cut)
        exp = call_hook(self.trainer, self, "on_rollout_scored", exp)
        exp = call_hook(self.trainer, self, "on_rewards_computed", exp)
        if self._any_rank_empty(len(exp)):
            return None
        self._fill_logprobs(exp)
        name = self.objective.advantage  # with the record's fields it `needs` beyond rewards, from exp
        exp.advantages = compute_advantages(name, exp.rewards, self.group_size,
                                            sum_over_ranks=partial(reduce_over_ranks, self._trainer),
                                            **estimator_fields(name, exp, self.loss_mask), **self.advantage_kwargs)
        return call_hook(self.trainer, self, "on_advantages_computed", exp)

    def _any_rank_empty(self, rows: int) -> bool:
        """Whether this step is skipped: some rank's hooks left no rows (an empty batch skips the
        step). Ranks agree first, so all skip together: one rank returning alone would leave the
        others blocked in the log-prob and advantage collectives. When only some ranks are empty,
        every rank warns naming them: the other ranks' rows are dropped with the step."""
        trainer = self._trainer
        if trainer is None or trainer.world_size <= 1:
            return rows == 0
        counts = [0.0] * trainer.world_size
        counts[trainer.global_rank] = float(rows)
        counts = reduce_over_ranks(trainer, counts)  # every rank's row count
        empty = [rank for rank, n in enumerate(counts) if n == 0]
        if empty and len(empty) < len(counts):
            warnings.warn(f"global step {trainer.global_step}: the hooks left rank(s) {empty} no rows, so every "
                          "rank skips this step (the other ranks' rows are dropped too). If a filter (e.g. "
                          "dynamic sampling) empties a rank, refill it (module.refill) or keep a minimum number "
                          "of rows per rank", UserWarning, stacklevel=3)
        return bool(empty)

    def check_engine(self) -> None:
        """At fit start: the installed engine against the `RolloutEngine` contract (what is missing
        is named), then `sync_if_behind`."""
        check_engine(self.engine)
        self.sync_if_behind()

    def sync_engine(self, force: bool = True) -> None:
        """Hand the current weights to the rollout engine. Callbacks that move the policy outside
        an optimizer step (a reference reset) call it with ``force`` (the default), which copies
        even where an engine would skip this version (``sync_every``); a forced sync must land."""
        self.engine.sync_weights(lambda: policy_weights(self.policy), self.policy_version, force=force)
        if force:
            check_synced(self.engine, self.policy_version, f"global step {self.global_step}")

    @property
    def staleness_bound(self) -> int:
        """The most steps a training rollout may lag the trainer: ``sync_every - 1`` plus what a
        pipeline generates ahead (``max_staleness``)."""
        return int(self.engine.sync_every) - 1 + int(self.engine.max_staleness)

    def sync_if_behind(self) -> None:
        """An engine holding other weights than the policy's (a resumed run, an engine installed by
        hand) receives them now. Called at fit start and again at train start: under sharded
        strategies (FSDP2) Lightning restores the checkpoint only after ``on_fit_start``."""
        if self.engine.held_version != self.policy_version:
            self.sync_engine()

    def rollout_and_score(self, batch: dict[str, list[Any]], seed: int) -> tuple[Experience, dict[str, int], int]:
        """Sample G completions per prompt, run ``on_rollout_end``, score them: the experience,
        reward failures per function and how many prompts were cut (also used by refills)."""
        check_held_version(self.engine, self.policy_version, f"global step {self.global_step}")
        with self.timer("rollout"):
            exp, cut = self.sample(batch, self.group_size, self.sampling, seed, self.hparams.seed_per_prompt,
                                   self.micro_batching.check_fits)
        exp.policy_version = self.engine.policy_version
        self.probe_parity(batch)  # after the batch's prompts were checked, before anything is scored or trained
        exp = call_hook(self.trainer, self, "on_rollout_end", exp)
        with self.timer("rewards"):
            failures = score_experience(exp, self.rewards, TrainerState.of(self._trainer))
        return exp, failures, cut

    def probe_parity(self, batch: dict[str, list[Any]]) -> None:
        """When due (`rollout.parity.ParityProbe`), after the training rollout's generation (its prompts
        checked) and before its scoring: the batch's first prompt completed greedily by the
        engine (the one behind a pipeline, drained first) and scored by the trainer's own log-prob
        path; logs ``sampling/parity_max`` (the worst rank's; Lightning repeats a metric's last value
        on the steps that do not log it, so between probes it is the last probe's) and stops the
        step on a gap. ``timing/parity`` is logged at every step, 0 where none ran."""
        engine = self.engine
        inner = engine.inner if isinstance(engine, RolloutPipeline) else engine
        if not self.parity.every or inner.phase != "training":
            return
        with self.timer("parity"):
            gap = None
            if self.parity.due(inner.held_version, self.policy_version, inner.sync_every):
                if inner is not engine:
                    engine.drain()  # the worker is idle while the probe uses the engine
                prompt = collect.tokenize_prompts(self.tokenizer, list(batch["prompt"])[:1], self.sampling)[0][0]
                gap = self.parity.measure(inner, prompt, self._probe_logprobs, self.policy_version)
        if gap is None:
            return
        gap = float(reduce_over_ranks(self._trainer, [gap], op="max")[0])  # every rank stops, or none
        self._log_dict({"sampling/parity_max": gap}, sync=False)
        self.parity.check(gap, inner, f"global step {self.global_step}", self._low_precision(inner))

    def probe_rejoined(self, engine: Any) -> None:
        """The parity probe on one server back after a drop (``engine``: a view of it alone), for
        `VLLMServerRollout`: ``ValueError`` when it does not sample from the policy (dropped again)."""
        self.parity.check_rejoined(engine, self._probe_logprobs, self._low_precision(engine))

    def _low_precision(self, engine: Any) -> bool:
        return low_precision(self._trainer.precision if self._trainer is not None else "32-true", engine)

    @torch.no_grad()
    def _probe_logprobs(self, ids: torch.Tensor, completion_len: int) -> torch.Tensor:
        ids = ids.to(self.device)
        return completion_logprobs(self.policy, ids, torch.ones_like(ids), completion_len,
                                   use_fused_kernel=self.hparams.use_fused_kernel)[0][0]

    def sample(self, batch: dict[str, list[Any]], group_size: int, sampling: Any, seed: int,
               seed_per_prompt: bool = False, check_prompts: Any = None) -> tuple[Experience, int]:
        """`collect.rollout`, or multi-turn episodes when the module has tools, an environment or
        a ``rollout_func`` (`rollout.episodes.rollout_episodes`): training and validation alike.
        Either refuses, before generating, a prompt of no tokens or one the context cannot hold
        with its completion (``_max_context``): the HF engine would not. The first batch whose
        prompts ``max_prompt_length`` cut gets a warning (`_warn_prompt_cut`)."""
        args = (self.engine, self.tokenizer, batch, group_size, sampling, seed, self.device, seed_per_prompt,
                check_prompts)
        if self.agent.active:
            exp, cut = rollout_episodes(self.agent, *args, max_context=self._max_context())
        else:
            exp, cut = collect.rollout(*args, max_context=self._max_context())
        if cut:
            self._warn_prompt_cut(cut, len(batch["prompt"]), sampling.max_prompt_length)
        return exp, cut

    def _warn_prompt_cut(self, cut: int, prompts: int, limit: int) -> None:
        """Warn once per module (per rank): a cut changes the task, so it must be seen, but every
        batch repeating it would bury other messages; ``prompts/truncated`` keeps counting."""
        if self._warned_prompt_cut:
            return
        self._warned_prompt_cut = True
        trainer = self._trainer
        where = f"global step {trainer.global_step}" if trainer is not None else "outside a Trainer"
        if trainer is not None and trainer.world_size > 1:
            where += f", rank {trainer.global_rank}"  # each rank sees only its own batch
        warnings.warn(collect.truncation_warning(cut, prompts, limit, where), UserWarning, stacklevel=3)

    def _log_rollout(self, exp: Experience, failures: dict[str, int], cut: int) -> None:
        """Rollout metrics over every rank's samples (gathered, so stds and groups are exact), and
        ``num_tokens``: TRL's running count of prompt + completion (model) tokens over all ranks."""
        kept = self.rewards.call_counts()  # a reward's own counts of its last call (same keys on every rank)
        counts = torch.tensor([*failures.values(), *kept.values(), cut], dtype=torch.float32, device=self.device)
        parts = [exp.scores, exp.rewards_per_func, exp.completion_mask.sum(1), exp.truncated,
                 exp.prompt_mask.sum(1), counts]
        if self.trainer.world_size > 1:
            parts = [g.flatten(0, 1) for g in self.all_gather(parts[:5])] + [self.all_gather(counts).sum(0)]
        rewards, per_func, lengths, truncated, prompt_lengths, counts = parts
        metrics = collect.rollout_metrics(rewards, per_func, lengths, truncated, self.group_size, self.rewards.names,
                                          counts[:len(failures)])
        metrics.update(zip(kept, counts[len(failures):-1].tolist()))
        self.fit_state.no_signal.see(metrics["frac_reward_zero_std"], metrics["reward"], self.group_size)
        self.tokens_seen += int(prompt_lengths.sum().item() + lengths.sum().item())
        # staleness: every engine; the ranks step together, so their versions (and lags) are equal
        self._log_dict({**metrics, "prompts/truncated": float(counts[-1]), "num_tokens": float(self.tokens_seen),
                        **staleness_metrics(self.policy_version, exp.policy_version, self.staleness_bound)}, sync=False)
        if "turns" in exp.info:  # multi-turn episodes (rollout/episodes)
            self._log_dict(self._episode_metrics(exp), sync=False)

    def _episode_metrics(self, exp: Experience) -> dict[str, float]:
        keys = ("turns", "tool_calls", "tool_failures", "tool_truncations", "episode_tokens")
        parts = [exp.info[k] for k in keys] + [exp.completion_mask.sum(1)]
        if self.trainer.world_size > 1:
            parts = [g.flatten(0, 1) for g in self.all_gather(parts)]
        return info_metrics(dict(zip(keys, parts)), parts[-1])

    def _max_context(self) -> int | None:
        """Prompt + episode tokens at most: the engine's context (vLLM's ``max_model_len``) or
        the model's positions, whichever is smaller."""
        limits = [self.engine.max_model_len,
                  getattr(getattr(self.policy, "config", None), "max_position_embeddings", None)]
        limits = [int(x) for x in limits if isinstance(x, int)]
        return min(limits) if limits else None

    @torch.no_grad()
    def _fill_logprobs(self, exp: Experience) -> None:
        """Old log-probs when the rollout is reused (μ > 1, several mini-batches) or a callback
        asks for them (``request(old_logprobs=True)``); reference ones (and entropies on request) for KL.

        A single on-policy pass needs no extra forward: before its one optimizer step the policy
        *is* the old policy, so the loss takes the detached current log-probs as old ones (and
        compares them with the engine's behaviour log-probs there), as TRL and verl do at μ = 1.
        """
        size = self.hparams.minibatch_size or len(exp)
        reused = self.hparams.updates_per_rollout > 1 or size < len(exp)
        if reused or self.requests.old_logprobs:
            with self.timer("old_logprobs"):
                exp.old_logprobs = self._logprobs(self.policy, exp)[0]
            if exp.behaviour_logprobs is not None:
                self._log_dict(mismatch_metrics(exp.old_logprobs, exp.behaviour_logprobs, exp.completion_mask.float()))
        if self.use_reference:
            with self.timer("ref_logprobs"), reference_context(self.policy, self.reference) as ref, onloaded(ref, self.device):
                exp.ref_logprobs, ref_entropy = self._logprobs(ref, exp, with_entropy=self.requests.ref_entropy)
            if ref_entropy is not None:
                exp.info["ref_entropy"] = ref_entropy

    def _logprobs(self, model: nn.Module, exp: Experience, with_entropy: bool = False, entropy_grad: bool = False):
        """Log-probs (and entropies) of ``exp``'s completions under ``model``, micro-batch by
        micro-batch when a budget is set (the no-grad forwards never exceed it either)."""
        def one(part: Experience):
            mask = span_mask(part) if self.micro_batching.padding_free else part.attention_mask
            return completion_logprobs(model, part.input_ids, mask, part.completion_ids.shape[1],
                                       temperature=self.sampling.temperature, with_entropy=with_entropy,
                                       entropy_grad=entropy_grad, use_fused_kernel=self.hparams.use_fused_kernel,
                                       padding_free=self.micro_batching.padding_free)

        return logprobs_in_chunks(one, exp, self.micro_batching, agree=self._agree_count)
