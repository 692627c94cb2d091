"""`RolloutPipeline`: rollouts generated up to ``max_staleness`` batches ahead of training.

The schedule is fixed, so a run is reproducible and resumes exactly: with ``k = max_staleness``,
training batch ``i`` is always sampled with the weights of the policy before batch ``i - k``
trained (the weights after batch ``i - k - 1``; batches ``0..k`` with the starting weights).
At the end of training batch ``j`` (all its optimizer steps done and synced) the next batch
``j + k + 1`` of the loader is submitted to one worker thread, which runs the engine's
``generate`` while the trainer goes on with batch ``j + 1`` (rewards, log-probs, the update):

    trainer   | train b0 (v0) | sync v1 | train b1 (v0) | sync v2 | train b2 (v1) | ...
    servers   | gen b1 (v0)   |  idle   | gen b2 (v1)   |  idle   | gen b3 (v2)   | ...   (k = 1)

Any engine that declares ``can_run_ahead`` (it samples from its own copy of the weights: vLLM
servers, or an engine of your own) can be wrapped; `callbacks.EngineCallback` does it for
``max_staleness=k``. Generation pauses around a weight update: before every sync the pipeline
waits for the batch in flight, so a batch is never sampled with two versions (vLLM's
``/pause?mode=keep`` would freeze requests and finish them on the new weights, mixing versions
inside one completion; the client side drain gives what ``/pause?mode=wait`` gives without the
extra routes). The engine holds one version at a time, so a batch's generation can only overlap
the one training batch before the next sync: ``k = 1`` buys all the overlap there is; ``k > 1``
only adds staleness.

The pipeline needs the prompts of future batches: `Lookahead` iterates an independent copy of
the training loader (same dataset, sampler copied and set to the epoch, same collate), which
gives the trainer's batches when the loader is deterministic (`PromptDataModule`'s
`EpochSampler`: seeded by ``seed + epoch``). The callback compares each batch the trainer
receives with the one generated for it and refuses a mismatch.

Seeds: batch ``n`` (counted over the run) is sampled with the seed
``seeding.keyed_seed("ahead", seed, n)``, not the module's rollout seed (drawn only when the
batch trains). Only the generation (token ids and
behaviour log-probs) is ahead; rewards, old/reference log-probs and advantages are computed at
training time as without the pipeline.

Examples:
    >>> pipeline = RolloutPipeline(engine, max_staleness=1, seed=0)  # doctest: +SKIP
    >>> pipeline.start(loader, epoch=0, tokenizer=tok, sampling=module.sampling, group_size=8)  # doctest: +SKIP
"""
from __future__ import annotations

import copy
import itertools
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from ..seeding import keyed_seed
from .collect import tokenize_prompts
from .engine import RolloutEngine, RolloutOutput, WeightSource
from .sampling import SamplingConfig

MISMATCH = ("max_staleness > 0 generates the rollouts of future batches from a copy of the training loader, so the "
            "loader must be deterministic (PromptDataModule's seeded EpochSampler; no unseeded shuffle, no sampler "
            "whose weights move during training, no limit_train_batches)")


class Lookahead:
    """The training loader's batches in the order the trainer will receive them, from an
    independent copy: the sampler is copied and set to each epoch (``set_epoch``) in turn.

    Args:
        loader: the trainer's training ``DataLoader``.
        epoch / index: the position of the first batch to yield (epoch, batch within it).
    """

    def __init__(self, loader: DataLoader, epoch: int, index: int = 0):
        self.loader, self.epoch, self.index = loader, int(epoch), int(index)
        self._batches = None

    def next(self) -> dict[str, list[Any]]:
        for _ in range(2):  # the rest of this epoch, else the start of the next one
            if self._batches is None:
                self._batches = itertools.islice(iter(self._epoch_loader(self.epoch)), self.index, None)
            batch = next(self._batches, None)
            if batch is not None:
                self.index += 1
                return batch
            self._batches, self.epoch, self.index = None, self.epoch + 1, 0
        raise RuntimeError(f"the training loader yields no batch in epoch {self.epoch}: nothing to roll out ahead")

    def _epoch_loader(self, epoch: int) -> DataLoader:
        loader = self.loader
        if isinstance(loader.dataset, IterableDataset):
            raise ValueError(f"the training loader reads an IterableDataset, which cannot be iterated ahead: {MISMATCH}")
        if loader.batch_size is None:  # a custom batch_sampler: copy it, and the sampler inside it
            batches = copy.copy(loader.batch_sampler)
            if hasattr(batches, "sampler"):
                batches.sampler = _at_epoch(batches.sampler, epoch)
            return DataLoader(loader.dataset, batch_sampler=batches, collate_fn=loader.collate_fn)
        return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=_at_epoch(loader.sampler, epoch),
                          collate_fn=loader.collate_fn, drop_last=loader.drop_last)


def _at_epoch(sampler: Any, epoch: int) -> Any:
    """A copy of ``sampler`` set to ``epoch`` (one without epochs as it is)."""
    sampler = copy.copy(sampler)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    return sampler


@dataclass
class Pending:
    """One future training batch: its loader batch, prompt rows (G per prompt), seed, the
    weight version it is sampled with, and its output (or the future that will hold it)."""

    batch: dict[str, list[Any]]
    prompt_ids: list[list[int]]
    seed: int
    version: int
    output: RolloutOutput | None = None
    future: Future | None = None

    def result(self) -> RolloutOutput:
        if self.output is None:
            self.output, self.future = self.future.result(), None  # HTTP calls are bounded by the pool's timeouts
        return self.output


def check_staleness(max_staleness: Any, sync_every: int | None = None) -> None:
    """``max_staleness``, and with it an engine's ``sync_every`` when given: both make rollouts stale."""
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"max_staleness must be an int >= 0 (got {max_staleness!r}): 0 samples each batch when it "
                         "trains, k >= 1 generates the next k batches while the trainer updates")
    if max_staleness and sync_every is not None and sync_every != 1:
        raise ValueError(f"max_staleness={max_staleness} with sync_every={sync_every}: both make rollouts stale; "
                         "use one of them (max_staleness with sync_every=1, or sync_every with max_staleness=0)")


class RolloutPipeline(RolloutEngine):
    """A `RolloutEngine` that hands out rollouts generated ahead by ``engine`` (see the module docstring).

    Args:
        engine: the engine that samples, one that declares ``can_run_ahead`` (it samples from its
            own copy of the weights, e.g. `RemoteVLLMEngine`); its ``phase`` other than
            ``"training"`` (validation) bypasses the pipeline.
        max_staleness: k >= 1, batches generated ahead of the one training.
        seed: keys every batch's rollout seed (`seeding`'s ``ahead`` stream).

    ``policy_version`` is the version the last rollout handed out was sampled with (what the
    module records as ``Experience.policy_version``); ``held_version`` is the inner engine's. The
    rest of the contract (``phase``, ``where``, ``max_model_len``, ...) is the inner engine's.
    """

    def __init__(self, engine: Any, max_staleness: int, seed: int = 0):
        if not getattr(engine, "can_run_ahead", False):
            raise ValueError(f"max_staleness={max_staleness} needs an engine that can generate on another worker while "
                             f"the trainer updates the policy; {type(engine).__name__} does not declare can_run_ahead "
                             "(an engine sampling from the live policy would read weights mid-update). Use "
                             "max_staleness=0 with it")
        self.inner, self.max_staleness, self.seed = engine, int(max_staleness), int(seed)
        self.queue: deque[Pending] = deque()
        self.submitted = 0  # batches submitted over the run (keys the seeds)
        self.lookahead: Lookahead | None = None
        self.position: tuple[int, int] | None = None  # restored lookahead position (epoch, index)
        self.policy_version = 0
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlpt-rollout-ahead")
        self._context: tuple[Any, SamplingConfig, int] | None = None

    # ---------------------------------------------------------------- schedule
    def start(self, loader: DataLoader, epoch: int, tokenizer: Any, sampling: SamplingConfig, group_size: int) -> None:
        """Begin at fit start: batches ``0..k`` (or, after a restore, what the checkpoint lacks)."""
        self._context = (tokenizer, sampling, int(group_size))
        epoch, index = self.position if self.position is not None else (epoch, 0)
        self.lookahead = Lookahead(loader, epoch, index)
        while len(self.queue) < self.max_staleness + 1:
            self.submit()

    def submit(self) -> None:
        """Send the loader's next batch to the worker, sampled with the engine's current weights."""
        tokenizer, sampling, group_size = self._context
        batch = self.lookahead.next()
        rows = [row for row in tokenize_prompts(tokenizer, list(batch["prompt"]), sampling)[0]
                for _ in range(group_size)]
        entry = Pending(batch, rows, keyed_seed("ahead", self.seed, self.submitted), int(self.inner.policy_version))
        entry.future = self._worker.submit(self.inner.generate, rows, sampling, entry.seed)
        self.queue.append(entry)
        self.submitted += 1

    def expect(self, batch: dict[str, list[Any]], where: str) -> None:
        """The trainer's next batch must be the one generated for it."""
        if not self.queue or self.queue[0].batch != batch:
            ahead = self.queue[0].batch.get("prompt", [])[:2] if self.queue else []
            raise RuntimeError(f"at {where} the trainer received prompts {list(batch.get('prompt', []))[:2]}..., but "
                               f"the rollout pipeline generated {list(ahead)}... for this batch: {MISMATCH}. Fix the "
                               "loader, or set max_staleness=0")

    # ---------------------------------------------------------------- the engine contract
    @property
    def held_version(self) -> int:
        return self.inner.policy_version

    phase = property(lambda self: self.inner.phase, lambda self, value: setattr(self.inner, "phase", value))
    where = property(lambda self: self.inner.where, lambda self, value: setattr(self.inner, "where", value))
    max_model_len = property(lambda self: self.inner.max_model_len)
    return_logprobs = property(lambda self: self.inner.return_logprobs)
    overrides = property(lambda self: self.inner.overrides)
    sync_every = property(lambda self: self.inner.sync_every)
    last_sync = property(lambda self: self.inner.last_sync)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        if self.inner.phase != "training":  # validation: now, on the latest weights
            self.drain()
            return self.inner.generate(prompt_ids, sampling, seed)
        if not self.queue or self.queue[0].prompt_ids != [list(p) for p in prompt_ids] or \
                sampling != self._context[1]:
            raise RuntimeError("a training rollout asked for prompts the pipeline did not generate ahead (a refill, a "
                               "multi-turn episode, or changed sampling settings): max_staleness > 0 generates "
                               "exactly one rollout per loader batch; set max_staleness=0 for these")
        entry = self.queue.popleft()
        output = entry.result()
        self.policy_version = entry.version
        return output

    def sync_weights(self, weights: WeightSource, version: int, force: bool = False) -> None:
        self.drain()  # no batch is sampled with two versions
        self.inner.sync_weights(weights, version, force)

    def drain(self) -> None:
        """Wait for the batch in flight (errors of the worker surface here)."""
        for entry in self.queue:
            entry.result()

    def close(self) -> None:
        """Stop the worker: queued batches are dropped, the one in flight is waited for (its HTTP
        calls are bounded by the pool's timeouts), so no stray request reaches the servers later."""
        self._worker.shutdown(wait=True, cancel_futures=True)

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The finished future rollouts (the one in flight is waited for) and the schedule's position."""
        self.drain()
        position = (self.lookahead.epoch, self.lookahead.index) if self.lookahead else self.position
        return {"submitted": self.submitted, "position": position, "max_staleness": self.max_staleness,
                "pending": [dict(batch=e.batch, prompt_ids=e.prompt_ids, seed=e.seed, version=e.version,
                                 completion_ids=e.output.completion_ids, logprobs=e.output.logprobs)
                            for e in self.queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rollouts generated ahead. A checkpoint generated further ahead than this run
        allows is refused: its batches would train staler than ``max_staleness`` says (a larger
        ``max_staleness`` is fine: the pipeline tops its queue up)."""
        saved = int(state.get("max_staleness", len(state["pending"]) - 1))  # older states: the queue's length
        if saved > self.max_staleness:
            raise ValueError(f"this checkpoint's rollout pipeline generated {saved} batches ahead (max_staleness={saved}), "
                             f"this run allows {self.max_staleness}: its restored batches would train up to {saved} "
                             f"steps stale. Resume with max_staleness={saved} (it cannot shrink mid-run), or start a new "
                             "run from these weights with the lower value")
        self.submitted, self.position = int(state["submitted"]), tuple(state["position"])
        self.queue = deque(Pending(p["batch"], p["prompt_ids"], p["seed"], p["version"],
                                   RolloutOutput(p["completion_ids"], p["logprobs"])) for p in state["pending"])
