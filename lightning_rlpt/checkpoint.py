"""What `RLModule` adds to a Lightning checkpoint, and the checks that refuse to resume from the
wrong one (docs/cli.md, "Resuming a run").

``checkpoint["lightning_rlpt"]`` holds:

- the run's state: ``policy_version``, ``rollout_draws`` (how many rollout seeds were drawn: the
  stream is a function of seed, rank and this count, see `seeding`), ``tokens_seen``
  (the ``num_tokens`` metric's running count), the ``knobs``
  and ``model_source``. A fit resumed from a checkpoint without it is refused: it would restart
  the policy version at 0 and replay the rollout stream from its start;
- ``algorithm``: the settings that change what is trained (`ALGORITHM_KEYS`). A fit resumed
  under other values is refused, naming each (saved vs now), unless ``RLModule(resume_overrides=
  (...))`` names it: then the run continues under the new value on purpose;
- ``checksums``: the CRC32 of every tensor of the module's ``state_dict`` as written (with
  ``checkpoint_checksums=True``, the default; 3 GB/s on 2 cores, benchmarks/checkpoint_checksum.py),
  verified at every load: a tensor whose bytes changed on disk is refused by name. Sharded
  (FSDP2 / DCP) tensors are not covered: each rank holds only its shard.
- ``state_checksums``: a CRC32 of every other part of the checkpoint (`state_checksums`: the
  optimizer's moments and step counts, schedulers, loops, callbacks, loaders, RNG states, this
  entry's own counters), verified when a fit resumes: a part whose value changed is refused by
  its path, e.g. ``optimizer_states.0.state.3.step``.

Validation and ``load_from_checkpoint`` only need weights, so the first two checks apply when
fitting; the checksums are verified whenever a checkpoint is loaded.
"""
from __future__ import annotations

import os
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable

import torch

from . import seeding
from .checkpoint_digest import state_checksums, verify_state_checksums

# The settings that define the algorithm: a resume must not change them silently. Memory caps
# (micro-batches, padding-free), logging, validation and the optimizer (whose state Lightning
# restores anyway) are left out: they do not change what is trained.
ALGORITHM_KEYS = ("policy_loss", "advantage", "loss_aggregation", "clip_low", "clip_high", "dual_clip", "kl_coef",
                  "kl_estimator", "group_size", "advantage_kwargs", "policy_loss_kwargs", "rollout_correction",
                  "rollout_correction_cap", "rollout_correction_kl", "updates_per_rollout", "minibatch_size", "mask_truncated_completions",
                  "top_entropy_quantile", "seed", "seed_per_prompt", "generation", "reward_funcs", "reward_weights",
                  "entropy_coef", "multi_objective_aggregation")
MEMORY_ONLY = ("max_batch_rows",)  # generation settings that change no completion (each row has its own seed)


def check_resume_overrides(names: Iterable[str]) -> tuple[str, ...]:
    """``resume_overrides`` as a tuple, every name one of `ALGORITHM_KEYS`."""
    names = (names,) if isinstance(names, str) else tuple(names or ())
    unknown = [n for n in names if n not in ALGORITHM_KEYS]
    if unknown:
        raise ValueError(f"resume_overrides names {unknown}, which are not compared at resume; "
                         f"compared: {', '.join(ALGORITHM_KEYS)}")
    return names


def algorithm_settings(module: Any) -> dict[str, Any]:
    """The module's values of `ALGORITHM_KEYS` (the objective's clip ranges and KL coefficient
    are the starting values: callbacks may move the knobs, which are restored separately)."""
    hp = module.hparams
    values = {**module.objective.to_dict(), "kl_estimator": module.kl_estimator, "group_size": module.group_size,
              "advantage_kwargs": dict(module.advantage_kwargs), "policy_loss_kwargs": dict(module.policy_loss_kwargs),
              "generation": {k: v for k, v in module.sampling.to_dict().items() if k not in MEMORY_ONLY},
              "reward_funcs": list(module.rewards.names),
              "reward_weights": module.rewards.weights.tolist()}
    values.update({k: hp.get(k) for k in ALGORITHM_KEYS if k not in values})
    return values


def tensor_checksums(state_dict: dict[str, Any]) -> dict[str, int]:
    """CRC32 of each full tensor's bytes (sharded DTensors are skipped: a rank holds a shard).
    Tensors run in parallel threads (zlib releases the GIL); a tensor shared under two names
    (tied embeddings) is read once."""
    tensors = {name: t for name, t in state_dict.items() if isinstance(t, torch.Tensor) and not hasattr(t, "full_tensor")}
    views = {name: (t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) for name, t in tensors.items()}
    first = {view: name for name, view in reversed(list(views.items()))}  # one name per distinct view
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        crcs = dict(zip(first.values(), pool.map(_crc32, (tensors[n] for n in first.values()))))
    return {name: crcs[first[view]] for name, view in views.items()}


def _crc32(tensor: torch.Tensor) -> int:
    data = tensor.detach().cpu().contiguous().reshape(-1)
    return zlib.crc32(data.view(torch.uint8).numpy()) if data.numel() else 0


def save_state(module: Any, checkpoint: dict[str, Any]) -> None:
    """`RLModule.on_save_checkpoint` (the last hook before the file is written): add
    ``checkpoint["lightning_rlpt"]``, its checksums last, over everything else."""
    mark_epoch_end(module._trainer, checkpoint)
    counters = {"policy_version": module.policy_version, "rollout_draws": module.rollout_draws,
                "tokens_seen": module.tokens_seen}
    counters.update(replay_interrupted_batch(module, checkpoint))
    checksums = tensor_checksums(checkpoint.get("state_dict") or {}) if module.hparams.checkpoint_checksums else None
    state = checkpoint["lightning_rlpt"] = {
        **counters, "knobs": module.knobs.state_dict(), "model_source": module.model_source,
        "algorithm": algorithm_settings(module), "checksums": checksums, "engine_held_version": held_version(module),
        "seeding": seeding.VERSION}
    if module.hparams.checkpoint_checksums:
        state["state_checksums"] = state_checksums(checkpoint)


def mark_epoch_end(trainer: Any, checkpoint: dict[str, Any]) -> None:
    """Write the loop counters of a checkpoint saved at an epoch's end (``on_train_epoch_end``:
    ``ModelCheckpoint(save_last=True)``'s ``last.ckpt`` when ``fit`` returns, or
    ``save_on_train_epoch_end``) as they will be once the epoch is over, so that a resume goes on
    exactly where the straight run goes on.

    Why: Lightning marks the epoch processed but not completed before that hook. Resuming from
    it, Lightning (with ``max_steps``) replays the epoch's end, which counts the epoch once more:
    an epoch that ``max_steps`` cut short was followed by the *next* epoch's permutation instead of
    its own remaining batches, and after a whole epoch the next one was skipped (sampler epoch 2
    after epoch 0) and the loggers' step labels moved one ahead (11-14 after 0-9)."""
    loops = (checkpoint.get("loops") or {}).get("fit_loop")
    fit_loop = getattr(trainer, "fit_loop", None)
    if not _known_loops(loops) or fit_loop is None or not getattr(trainer, "training", False):
        return
    epoch = fit_loop.epoch_progress.current
    if epoch.processed != epoch.completed + 1:
        return  # not inside on_train_epoch_end
    as_last_batch_end(loops)


def _known_loops(loops: Any) -> bool:
    """The fit loop's state in the layout these rewrites know (Lightning 2.x); another is left alone."""
    keys = ("epoch_progress", "epoch_loop.batch_progress", "epoch_loop.state_dict")
    return isinstance(loops, dict) and all(isinstance(loops.get(k), dict) for k in keys)


def as_last_batch_end(loops: dict[str, Any]) -> None:
    """The fit loop's counters as a checkpoint saved at the end of the epoch's last batch has them
    (Lightning resumes those exactly, into the same epoch or, after its last batch, the next one):
    the epoch started but not processed, that batch not completed, one logger step fewer (the
    resume adds it back). Written ``ready = started = processed + 1`` as at any batch end: after
    one resume Lightning leaves ``ready`` and ``started`` behind, which a second resume misreads."""
    for progress in ("total", "current"):
        counts = loops["epoch_progress"][progress]
        counts["processed"] = counts["completed"]
        counts["ready"] = counts["started"] = counts["completed"] + 1
        loops["epoch_loop.batch_progress"][progress]["completed"] -= 1
    loops["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1


def remember_counters(module: Any, *_: Any) -> None:
    """`RLModule.on_train_batch_end`: the counters the next batch starts from, which a crash in it
    is saved with (the module's own hook, as callbacks' ``on_train_batch_start`` run before it)."""
    module._batch_start_counters = {"policy_version": module.policy_version, "rollout_draws": module.rollout_draws,
                                    "tokens_seen": module.tokens_seen}


def replay_interrupted_batch(module: Any, checkpoint: dict[str, Any]) -> dict[str, int]:
    """A checkpoint saved by a crash (``OnExceptionCheckpoint``, the trainer interrupted) inside a
    batch that had not updated the policy yet is written as the checkpoint of the previous batch's
    end, with the module's counters from the batch's start: the resume replays that batch, seed
    included. Lightning's own counters would skip it (its prompts never trained, one step label
    lost). Returns the counters to save (none when there is nothing to replay).

    Not exact: a crash after the batch's first optimizer step (the checkpoint holds a half-applied
    batch; Lightning's counters are kept), or after a callback recorded the batch's statistics."""
    trainer = module._trainer
    loops = (checkpoint.get("loops") or {}).get("fit_loop")
    start = getattr(module, "_batch_start_counters", None)
    if not _known_loops(loops) or start is None or trainer.state.status != "interrupted":
        return {}
    batches = trainer.fit_loop.epoch_loop.batch_progress.current
    if batches.completed >= batches.ready or batches.completed == 0 or start["policy_version"] != module.policy_version:
        return {}
    for progress in ("total", "current"):
        counts = loops["epoch_loop.batch_progress"][progress]
        done = counts["completed"]
        counts.update(ready=done, started=done, processed=done, completed=done - 1)
    loops["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1
    for state in (loops.get("state_dict") or {}).get("combined_loader") or []:
        if isinstance(state, dict) and "consumed" in state:
            state["consumed"] = batches.completed
    return dict(start)


def load_state(module: Any, checkpoint: dict[str, Any]) -> None:
    """`RLModule.on_load_checkpoint`: check the checkpoint (see the module docstring), then restore."""
    trainer = module._trainer
    fitting = trainer is not None and trainer.state.fn == "fit"
    state = checkpoint.get("lightning_rlpt")
    verify_checksums((state or {}).get("checksums"), checkpoint.get("state_dict") or {})
    sharded = os.path.isdir(str(getattr(trainer, "ckpt_path", None) or ""))  # DCP: each rank reloads its own view
    if fitting and state and state.get("state_checksums") and not sharded:
        verify_state_checksums(state["state_checksums"], checkpoint, getattr(trainer, "ckpt_path", None))
    if not state:
        if fitting:
            raise ValueError(missing_state_message(getattr(trainer, "ckpt_path", None)))
        return
    if fitting:
        compare_algorithm(state.get("algorithm"), algorithm_settings(module), module.hparams.resume_overrides)
    older = [key for key in ("rollout_draws", "algorithm", "checksums") if key not in state]
    if older:
        warnings.warn(f"this checkpoint was written by an older lightning_rlpt and lacks {older}: settings and "
                      "tensors are not checked, and the rollout stream continues from its policy version instead "
                      "of where the run left it", stacklevel=2)
    if fitting:
        warn_between_syncs(state.get("engine_held_version"), state["policy_version"])
        warn_other_seeding(state.get("seeding", 1))
    module.policy_version = state["policy_version"]
    module.rollout_draws = state.get("rollout_draws", state["policy_version"])
    module.tokens_seen = state.get("tokens_seen", 0)  # num_tokens: older checkpoints did not count
    module.knobs.load_state_dict(state.get("knobs", state))  # older checkpoints kept the knobs at the top


def warn_other_seeding(version: int) -> None:
    """A checkpoint whose seeds were derived otherwise (1: before `seeding`) resumes, with a
    warning: weights, optimizer and counters are exact, but the continuation draws other
    completions than the run that wrote it would have. Refusing would strand every such run."""
    if version != seeding.VERSION:
        warnings.warn(f"this checkpoint was written with lightning_rlpt's seed derivation {version}, this version "
                      f"uses {seeding.VERSION} (lightning_rlpt.seeding): the weights, optimizer and counters resume "
                      "exactly, but from here on the run samples other completions than the run that wrote it "
                      "would have. To continue that run draw for draw, resume it with the lightning_rlpt version "
                      "that wrote it", stacklevel=3)


def held_version(module: Any) -> int:
    """The step whose weights the rollout engine held (the policy's, before any engine exists)."""
    engine = module.rollout_engine
    return int(engine.held_version) if engine is not None else int(module.policy_version)


def warn_between_syncs(held: int | None, version: int) -> None:
    """A checkpoint saved between two weight syncs (``sync_every > 1``) holds the policy but not
    the older weights the engine sampled with; the resumed engine receives the policy's, so the
    rollouts until the next sync are sampled fresher than in an uninterrupted run. Said, not refused:
    training stays correct, only the exact replay is lost."""
    if held is not None and held < version:
        warnings.warn(f"this checkpoint (step {version}) was saved between weight syncs: the rollout engine held step "
                      f"{held}'s weights, which a checkpoint does not keep. The resumed engine gets step {version}'s, "
                      "so rollouts until the next sync differ from an uninterrupted run's. For an exact resume with "
                      "sync_every=k, checkpoint at multiples of k (ModelCheckpoint(every_n_train_steps=k))", stacklevel=2)


def compare_algorithm(saved: dict[str, Any] | None, now: dict[str, Any], overrides: Iterable[str]) -> None:
    """Refuse to continue under settings other than the saved ones, naming each (``overrides`` excepted).
    ``generation`` is compared option by option; a key the checkpoint lacks (written before the
    key existed) counts as the value that version used (`OLD_DEFAULTS`)."""
    if saved is None:
        return
    diffs = [d for key in now if key not in overrides for d in _differences(key, saved, now[key])]
    if diffs:
        changed = [f"{_name(key, option)}: saved {old!r}, now {new!r}" for key, option, old, new in diffs]
        keys = tuple(dict.fromkeys(key for key, *_ in diffs))
        raise ValueError("this checkpoint was trained with other settings than this RLModule's, and resuming would "
                         "silently switch to the new ones: " + "; ".join(changed) + ". Build the module with the "
                         f"saved values ({_saved_values(diffs)}), or pass RLModule(resume_overrides={keys!r}) to "
                         "continue under the new ones")


# What a checkpoint written before a setting existed trained with: that setting's value then.
# (``max_prompt_length`` was always saved, explicitly: its old default 512 is compared as saved.)
OLD_DEFAULTS = {"entropy_coef": 0.0, "multi_objective_aggregation": "sum_then_normalize"}
OLD_GENERATION_DEFAULTS = {"generation_kwargs": None}


def _differences(key: str, saved: dict[str, Any], value: Any) -> list[tuple[str, str | None, Any, Any]]:
    """``(key, option, saved, now)`` for each part of ``key`` that differs (``generation``: per option;
    ``option`` is None for a whole setting)."""
    if key == "generation" and isinstance(saved.get(key), dict) and isinstance(value, dict):
        old = {**OLD_GENERATION_DEFAULTS, **saved[key]}
        return [(key, k, old[k], v) for k, v in value.items() if k in old and not _same(old[k], v)]
    if key not in saved and key not in OLD_DEFAULTS:
        return []
    old = saved.get(key, OLD_DEFAULTS.get(key))
    return [] if _same(old, value) else [(key, None, old, value)]


def _name(key: str, option: str | None) -> str:
    return key if option is None else f"{key}[{option!r}]"


def _saved_values(diffs: list[tuple[str, str | None, Any, Any]]) -> str:
    """The constructor arguments that restore the saved values, e.g. ``generation=dict(max_prompt_length=512)``."""
    parts = [f"{key}={old!r}" for key, option, old, _ in diffs if option is None]
    options = [f"{option}={old!r}" for _, option, old, _ in diffs if option is not None]
    if options:
        parts.append(f"generation=dict({', '.join(options)}) next to your other generation options")
    return ", ".join(parts)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (RuntimeError, ValueError, TypeError):  # tensors inside option dicts: compare what they print
        return repr(a) == repr(b)


def verify_checksums(saved: dict[str, int] | None, state_dict: dict[str, Any]) -> None:
    """Refuse tensors whose bytes no longer give the CRC32 written at save, naming them."""
    if not saved:
        return
    now = tensor_checksums({name: state_dict.get(name) for name in saved})
    bad = [name for name, crc in saved.items() if name in now and now[name] != crc]
    if bad:
        raise ValueError(f"checkpoint tensor(s) {bad[:5]}{' and more' if len(bad) > 5 else ''} do not match the "
                         "checksum written when the checkpoint was saved: the file was corrupted (disk, copy or "
                         "transfer). Copy it again from its source or resume from an earlier checkpoint")


def missing_state_message(path: str | None) -> str:
    where = repr(path) if path else "this checkpoint"
    return (f"{where} has no 'lightning_rlpt' state (policy version, rollout stream, knobs, settings): it was not "
            "saved from an RLModule, or that entry was removed, so resuming would restart the policy version at 0 "
            "and replay the rollout stream from its start. To start a new run from its weights instead, drop "
            "ckpt_path and load them first: module.load_state_dict(torch.load(path, weights_only=False)"
            "['state_dict']); or pass a model directory as RLModule(model=...) (`lightning_rlpt.model.export."
            "export_checkpoint` writes one from an RLModule checkpoint)")
