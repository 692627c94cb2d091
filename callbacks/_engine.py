"""What the callbacks that install a rollout engine share (`VLLMRollout`, `VLLMServerRollout`):
make an engine the module's rollout engine, mark the validation phase's end, and at teardown or
on an exception put the previous engine back and close what this callback started."""
from __future__ import annotations

from typing import Any

import lightning as L

from lightning_rlpt.hooks import RLCallback


class EngineCallback(RLCallback):
    """Base of the engine-installing callbacks. Subclasses set ``self.engine`` through
    `_install` in ``setup`` and override `_close` (how their engine ends) and `_cleanup`
    (anything else they made), both called from `_release`."""

    engine: Any = None
    _previous: Any = None
    _serving: Any = None  # what the module samples through: the engine, or a wrapper around it (a pipeline)

    def _install(self, module: L.LightningModule, engine: Any, serve: Any = None) -> None:
        self._previous, self.engine, self._serving = module.rollout_engine, engine, serve or engine
        module.rollout_engine = self._serving

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

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.engine is not None:
            self.engine.phase = "training"

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._release(pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._release(pl_module)

    def _release(self, module: L.LightningModule) -> None:
        if self.engine is not None:
            if module.rollout_engine is self._serving:
                module.rollout_engine = self._previous
            self._close(self.engine)
            self.engine, self._previous, self._serving = None, None, None
        self._cleanup()

    def _close(self, engine: Any) -> None:
        engine.close()

    def _cleanup(self) -> None:
        """Remove what the callback made besides its engine (nothing by default)."""
