"""`EngineCallback`: the one way to install a rollout engine for a run (`VLLMRollout`,
`VLLMServerRollout` and any user's engine callback subclass it)."""
from __future__ import annotations

from typing import Any

import lightning as L

from lightning_rlpt.hooks import RLCallback, check_module
from lightning_rlpt.rollout.contract import check_engine
from lightning_rlpt.rollout.pipeline import RolloutPipeline, check_staleness


class EngineCallback(RLCallback):
    """Base of the callbacks that give the module a rollout engine (docs/architecture.md,
    "Adding a rollout engine").

    A subclass builds its engine in ``setup`` and calls ``self.install(trainer, pl_module, engine)``
    (first `check_fit`, when building the engine is costly); everything else is done here:

    - the engine is checked against the `RolloutEngine` contract (`rollout.contract.check_engine`)
      and becomes ``module.rollout_engine``; the previous one is put back at ``teardown`` or on an
      exception, after `close_engine` (default: ``engine.close()``) and `cleanup`;
    - ``engine.phase`` and ``engine.where`` follow the run (training / validation, the step);
      validation first hands a lagging engine the current weights (``module.sync_engine()``);
    - with ``max_staleness=k > 0`` (fitting only) the module samples through a `RolloutPipeline`:
      rollouts generated k batches ahead on a worker thread, for an engine that declares
      ``can_run_ahead``. The pipeline starts when training starts, is fed after every batch,
      checks each batch the trainer receives against the one generated for it, drains before
      validation and is checkpointed (``state_dict``), so a resumed run equals an uninterrupted one.

    The module checks staleness and logs ``async/staleness/*`` for every engine.

    Args:
        max_staleness: batches generated ahead of the one training (0: each batch is sampled when it
            trains). Needs one trainer process, no multi-turn episodes, no `CurriculumSampler`.
        async_seed: keys the rollout seeds of batches generated ahead (`seeding`'s ``ahead`` stream).
        sync_every: the engine's, when the subclass knows it before building the engine: then
            ``max_staleness`` with ``sync_every > 1`` is refused at construction, else at `install`.
    """

    requires = ("rollout_engine", "policy_version", "sync_engine", "tokenizer", "sampling", "group_size", "episodes")

    engine: Any = None
    max_staleness: int = 0
    async_seed: int = 0
    pipeline: RolloutPipeline | None = None
    _previous: Any = None
    _serving: Any = None  # what the module samples through: the engine, or the pipeline around it
    _pipeline_state: dict[str, Any] | None = None  # a checkpoint's, until the pipeline exists

    def __init__(self, *, max_staleness: int = 0, async_seed: int = 0, sync_every: int | None = None):
        # The one check of max_staleness: with the engine's sync_every when the subclass knows it
        # now (else at install, from the engine).
        check_staleness(max_staleness, sync_every)
        self.max_staleness, self.async_seed, self._sync_every = max_staleness, int(async_seed), sync_every
        self._checked = False

    # ---------------------------------------------------------------- installing
    def check_fit(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """The module's surface, and what cannot run ahead of training: refused once per fit, by
        `install` at the latest; a subclass that starts something costly (servers) calls it first."""
        if self._checked:
            return
        check_module(self, module)
        if self.max_staleness and trainer.state.fn == "fit":
            refuse_async_with(trainer, module, self.max_staleness)
        self._checked = True

    def install(self, trainer: L.Trainer, module: L.LightningModule, engine: Any) -> None:
        """Make ``engine`` the module's rollout engine (through a pipeline when ``max_staleness``)."""
        ahead = self.max_staleness and trainer.state.fn == "fit"
        # Installed before the checks, so an engine that fails them is still closed at teardown.
        self._previous, self.engine, self._serving = module.rollout_engine, engine, engine
        module.rollout_engine = engine
        self.check_fit(trainer, module)
        check_engine(engine)
        if ahead:
            if self._sync_every is None:
                check_staleness(self.max_staleness, engine.sync_every)
            self.pipeline = RolloutPipeline(engine, self.max_staleness, seed=self.async_seed)
            if self._pipeline_state is not None:
                self.pipeline.load_state_dict(self._pipeline_state)
            self._serving = module.rollout_engine = self.pipeline

    def _refuse_turn_budget_override(self, module: L.LightningModule) -> None:
        """A ``max_tokens`` override would replace every turn's token limit inside an episode, past the
        episode's model-token budget and the context the loop cuts at: refuse it with episodes."""
        max_tokens = self.overrides.get("max_tokens")
        if max_tokens is not None and module.episodes:
            raise ValueError(
                f"{type(self).__name__}(max_tokens={max_tokens}) cannot be used with multi-turn episodes (tools, "
                "environment or rollout_func): it would replace each turn's limit and bypass the episode's budget. "
                f"Set RLModule(generation=dict(max_new_tokens={max_tokens})) instead: with episodes it counts the "
                "model's tokens over all turns")

    # ---------------------------------------------------------------- training
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Under sharded strategies (FSDP2) Lightning restores a checkpoint after on_fit_start: the
        # engine may hold the weights from before it. Sync before anything is generated ahead.
        if self.engine is not None and self.engine.held_version != pl_module.policy_version:
            pl_module.sync_engine()
        if self.pipeline is not None:
            self.pipeline.start(trainer.train_dataloader, trainer.current_epoch, pl_module.tokenizer,
                                pl_module.sampling, pl_module.group_size)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.engine is None:
            return
        self.engine.phase, self.engine.where = "training", f"global step {trainer.global_step}"
        if self.pipeline is not None:
            self.pipeline.expect(batch, self.engine.where)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.pipeline is not None:  # batch j trained and synced: generate batch j + k + 1 meanwhile
            self.pipeline.submit()

    # ---------------------------------------------------------------- validation
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.engine is None:
            return
        if self.pipeline is not None:
            self.pipeline.drain()  # the batch in flight finishes as a training rollout
        self.engine.phase = "validation"
        if self.engine.held_version != pl_module.policy_version:
            pl_module.sync_engine()  # validation scores the policy being trained, not a stale copy

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.engine is not None:
            self.engine.where = f"global step {trainer.global_step}, validation batch {batch_idx}"

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.engine is not None:
            self.engine.phase = "training"

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """With ``max_staleness``: the rollouts generated ahead (the one in flight waited for)."""
        if self.pipeline is not None:
            return {"pipeline": self.pipeline.state_dict()}
        return {"pipeline": self._pipeline_state} if self._pipeline_state else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Lightning restores callbacks after setup: the pipeline exists already when fitting.
        self._pipeline_state = state.get("pipeline")
        if self.pipeline is not None and self._pipeline_state is not None:
            self.pipeline.load_state_dict(self._pipeline_state)

    # ---------------------------------------------------------------- shutdown
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._release(pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._release(pl_module)

    def _release(self, module: L.LightningModule) -> None:
        if self.engine is not None:
            if module.rollout_engine is self._serving:
                module.rollout_engine = self._previous
            if self.pipeline is not None:  # its worker stops before the engine does
                self.pipeline.close()
                self.pipeline = None
            self.close_engine(self.engine)
            self.engine, self._previous, self._serving = None, None, None
        self._pipeline_state = None  # a checkpoint's queue belongs to the fit that restored it
        self._checked = False  # the next fit is checked afresh
        self.cleanup()

    def close_engine(self, engine: Any) -> None:
        """How this callback's engine ends (a caller's engine may stay open)."""
        engine.close()

    def cleanup(self) -> None:
        """Remove what the callback made besides its engine (nothing by default)."""


def refuse_async_with(trainer: L.Trainer, module: L.LightningModule, max_staleness: int) -> None:
    """What cannot run ahead of training, refused before any engine starts."""
    if trainer.world_size > 1:  # each rank would run its own pipeline; never run, so refused rather than guessed
        raise ValueError(f"max_staleness={max_staleness} with {trainer.world_size} trainer processes is not supported "
                         "yet: each rank would generate ahead on its own and their syncs are untested. Use one trainer "
                         "process (devices=1) with max_staleness, or max_staleness=0 under DDP")
    if module.episodes:
        raise ValueError(f"max_staleness={max_staleness} cannot run multi-turn episodes (tools, environment or "
                         "rollout_func): each turn's prompt depends on the previous turn's tool results. Use "
                         "max_staleness=0 with episodes")
    from .curriculum_sampler import CurriculumSampler

    if any(isinstance(c, CurriculumSampler) for c in trainer.callbacks):
        raise ValueError(f"max_staleness={max_staleness} cannot run with CurriculumSampler: its sampling weights and "
                         "filters follow the pass rates of the batches just trained, so batches drawn "
                         f"{max_staleness} step(s) ahead would come from stale weights (and refills cannot be "
                         "generated ahead). Use max_staleness=0 with a curriculum")
