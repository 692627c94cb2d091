"""The module's side of the engine contract (`rollout.engine.RolloutEngine`): the installed engine
checked when fitting starts, and its weights' version checked before every training rollout.

Both turn a silent failure into an error. An engine missing an attribute would be read by
duck typing and fall back to a guess; one whose ``sync_weights`` never copies (or never records
the version it received) samples from old weights while the learner believes it is on-policy.
"""
from __future__ import annotations

from typing import Any

from .engine import ENGINE_ATTRIBUTES, ENGINE_METHODS

CONTRACT = "the RolloutEngine contract (lightning_rlpt/rollout/engine.py; docs/architecture.md, \"Adding a rollout engine\")"


def check_engine(engine: Any) -> None:
    """Refuse an engine that lacks an attribute or a method the module and callbacks read, or
    whose ``sync_weights`` was never defined (still the abstract one), naming each."""
    name = type(engine).__name__
    missing_sync = not callable(getattr(engine, "sync_weights", None)) or \
        getattr(getattr(type(engine), "sync_weights", None), "__isabstractmethod__", False)
    if missing_sync:
        raise TypeError(f"the rollout engine {name} defines no sync_weights(weights, version, force=False): it would "
                        "sample from stale weights without a word. Define it to copy weights() and set "
                        "policy_version = version (an engine that samples from the policy itself records the version "
                        f"only, as HFGenerateEngine does); see {CONTRACT}")
    missing = [a for a in ENGINE_ATTRIBUTES if not hasattr(engine, a)]
    missing += [f"{m}()" for m in ENGINE_METHODS if not callable(getattr(engine, m, None))]
    if missing:
        raise TypeError(f"the rollout engine {name} lacks {', '.join(missing)}, which the module and callbacks read. "
                        f"Subclass lightning_rlpt.rollout.RolloutEngine (it gives each a default) or define them; "
                        f"see {CONTRACT}")


def check_held_version(engine: Any, trainer_version: int, where: str) -> None:
    """Before a training rollout the engine holds the weights of at most ``sync_every - 1`` steps
    ago, and never of a step the trainer has not taken."""
    behind = trainer_version - int(engine.held_version)
    if behind < 0:
        raise RuntimeError(
            f"the rollout engine {type(engine).__name__} holds step {engine.held_version}'s weights at {where}, which "
            f"the trainer (at step {trainer_version}) has not reached: its policy_version runs ahead of the versions "
            "it was sent (sync_weights must set policy_version to the version it copied)")
    if behind >= engine.sync_every:
        raise RuntimeError(
            f"the rollout engine {type(engine).__name__} holds step {engine.held_version}'s weights at {where}, "
            f"but the policy is at step {trainer_version} with sync_every={engine.sync_every}: a weight sync was "
            "skipped or failed (sync_weights must set policy_version to the version it copied). Not sampling from "
            "stale weights")


def check_synced(engine: Any, version: int, where: str) -> None:
    """After a forced sync the engine holds ``version``: a sync that did not land would leave
    validation (or the next rollouts) on older weights without a word."""
    if int(engine.held_version) != int(version):
        raise RuntimeError(f"the rollout engine {type(engine).__name__} was sent step {version}'s weights at {where} "
                           f"but holds step {engine.held_version}'s: its sync_weights(weights, version, force=True) "
                           f"must copy them and set policy_version = version; see {CONTRACT}")


def staleness_metrics(trainer_version: int, sampled_version: int, bound: int) -> dict[str, float]:
    """``async/staleness/{mean,max}``: optimizer steps between the weights a batch was sampled with
    and the trainer's (0 on-policy; up to ``bound``: ``sync_every - 1`` plus the pipeline's
    ``max_staleness``). A lag outside ``[0, bound]`` is refused, not logged."""
    lag = float(trainer_version - sampled_version)
    if lag < 0:
        raise RuntimeError(f"a rollout claims step {sampled_version}'s weights while the policy is at step "
                           f"{trainer_version}: the engine's policy_version runs ahead of the weights it was sent")
    if lag > bound:
        raise RuntimeError(f"a rollout was sampled with step {sampled_version}'s weights and would train at step "
                           f"{trainer_version}, {int(lag)} steps stale; sync_every and max_staleness allow {bound}. "
                           "A sync was skipped, or a restored rollout was generated further ahead than this run allows")
    return {"async/staleness/mean": lag, "async/staleness/max": lag}
