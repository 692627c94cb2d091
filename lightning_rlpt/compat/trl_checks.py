"""Values of mapped ``GRPOConfig`` fields that `lightning_rlpt.compat.trl` cannot honour, each
named with what to use instead (all of one config's problems are reported together)."""
from __future__ import annotations

import warnings
from typing import Any

# TRL loss_type -> loss aggregation here (TRL ``GRPOTrainer._compute_loss``'s normalisation per loss_type).
LOSS_AGGREGATION = {"dapo": "token-mean", "cispo": "token-mean", "vespo": "token-mean", "bnpo": "bnpo",
                    "grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "luspo": "seq-mean-token-mean",
                    "dr_grpo": "seq-mean-token-sum-norm"}
# TRL loss_type -> policy loss here, where it is not the PPO clip (``ppo_clip``, or ``gspo`` at sequence level).
POLICY_LOSS = {"cispo": "cispo", "sapo": "sapo", "luspo": "luspo", "vespo": "vespo"}
# The importance-sampling level each of those needs (None: either).
LEVEL = {"cispo": "token", "sapo": "token", "vespo": "token", "luspo": "sequence"}
SCALE_REWARDS = {"group": "grpo", "batch": "grpo_batch_std", "none": "dr_grpo"}
CORRECTION = {"token_truncate": "token_tis", "token_mask": "token_mis", "sequence_truncate": "seq_tis",
              "sequence_mask": "seq_mis"}
SCHEDULES = ("linear", "cosine", "cosine_with_min_lr", "constant")
# TRL's token-level correction modes as VESPO's ``behaviour_mode`` (TRL refuses VESPO with the sequence ones).
VESPO_MODE = {"token_truncate": "truncate", "token_mask": "mask"}


def scale_rewards(cfg: dict[str, Any]) -> str:
    """TRL's ``scale_rewards`` with its boolean spellings resolved (True: group, False: none)."""
    return {True: "group", False: "none"}.get(cfg["scale_rewards"], cfg["scale_rewards"])


def check_choices(cfg: dict[str, Any]) -> list[str]:
    """Problems with the loss, the rewards' scaling, the correction and the schedule."""
    out = _check_loss(cfg)
    if scale_rewards(cfg) not in SCALE_REWARDS:
        out.append(f"scale_rewards={cfg['scale_rewards']!r}: use one of {sorted(SCALE_REWARDS)}")
    if cfg["multi_objective_aggregation"] not in ("sum_then_normalize", "normalize_then_sum"):
        out.append(f"multi_objective_aggregation={cfg['multi_objective_aggregation']!r}: use 'sum_then_normalize' "
                   "or 'normalize_then_sum'")
    if cfg["vllm_importance_sampling_mode"] not in CORRECTION:
        out.append(f"vllm_importance_sampling_mode={cfg['vllm_importance_sampling_mode']!r}: use one of "
                   f"{sorted(CORRECTION)}")
    if cfg["lr_scheduler_type"] not in SCHEDULES:
        out.append(f"lr_scheduler_type={cfg['lr_scheduler_type']!r}: use one of {list(SCHEDULES)}, or "
                   "RLModule(lr_scheduler=...)")
    elif cfg["lr_scheduler_type"] == "constant" and cfg["warmup_steps"]:
        out.append(f"warmup with lr_scheduler_type='constant': use 'linear' or 'cosine' (TRL's "
                   "'constant_with_warmup' is not mapped)")
    elif cfg["lr_scheduler_type"] == "cosine_with_min_lr" and min_lr_ratio(cfg) is None:
        out.append(f"lr_scheduler_type='cosine_with_min_lr' with lr_scheduler_kwargs={cfg['lr_scheduler_kwargs']!r}: "
                   "give min_lr_rate (or min_lr) in lr_scheduler_kwargs, as transformers requires")
    elif cfg["lr_scheduler_kwargs"] and cfg["lr_scheduler_type"] != "cosine_with_min_lr":
        out.append(f"lr_scheduler_kwargs={cfg['lr_scheduler_kwargs']!r} with lr_scheduler_type="
                   f"{cfg['lr_scheduler_type']!r}: use RLModule(lr_scheduler=functools.partial(...))")
    return out + _check_batch(cfg)


def _check_loss(cfg: dict[str, Any]) -> list[str]:
    loss, level = cfg["loss_type"], cfg["importance_sampling_level"]
    if loss not in LOSS_AGGREGATION:
        return [f"loss_type={loss!r}: use one of {sorted(LOSS_AGGREGATION)}"]
    out = []
    if loss == "cispo" and (cfg["epsilon_high"] is None or cfg["epsilon_high"] <= 1):
        out.append(f"epsilon_high={cfg['epsilon_high']!r} with loss_type='cispo': TRL reads it as the absolute cap on "
                   "the IS weight; set it > 1 (ScaleRL recommends 5.0)")
    if level not in ("token", "sequence"):
        out.append(f"importance_sampling_level={level!r}: use 'token' or 'sequence'")
    elif LEVEL.get(loss, level) != level:
        # TRL only warns for luspo/vespo; here each of these losses has one level, so another would be a
        # different computation from the one the config asks for.
        out.append(f"importance_sampling_level={level!r} with loss_type={loss!r}: use {LEVEL[loss]!r} "
                   f"({loss} here is {LEVEL[loss]}-level only)")
    mode = cfg["vllm_importance_sampling_mode"]
    if loss == "vespo" and cfg["vllm_importance_sampling_correction"] and mode in CORRECTION and mode not in VESPO_MODE:
        out.append(f"vllm_importance_sampling_mode={mode!r} with loss_type='vespo': VESPO weighs each token's sampler "
                   "ratio inside its sequence weight, so TRL refuses the sequence modes too; use 'token_truncate' or "
                   "'token_mask', or vllm_importance_sampling_correction=False")
    if loss == "bnpo" and cfg["gradient_accumulation_steps"] > 1:
        _warn_bnpo_accumulation(cfg["gradient_accumulation_steps"])
    return out


def _warn_bnpo_accumulation(accumulate: int) -> None:
    # A warning, not a refusal: the two agree whenever the micro-batches hold equal token counts.
    warnings.warn(f"loss_type='bnpo' with gradient_accumulation_steps={accumulate}: here bnpo divides the optimizer "
                  f"step's loss by the rank's token count over all {accumulate} micro-batches (every token weighs the "
                  "same); TRL divides each micro-batch by its own token count and averages the micro-batches (a token "
                  "of a micro-batch with fewer tokens weighs more). They agree when the micro-batches hold equal token "
                  "counts; for TRL's weighting exactly, use gradient_accumulation_steps=1.", UserWarning, stacklevel=4)


def _check_batch(cfg: dict[str, Any]) -> list[str]:
    out = []
    if cfg["generation_batch_size"] is not None and cfg["steps_per_generation"] is None:
        out.append(f"generation_batch_size={cfg['generation_batch_size']!r}: give steps_per_generation instead "
                   "(generation_batch_size counts completions over all processes: per_device_train_batch_size × "
                   "processes × steps_per_generation)")
        return out
    rollout = cfg["per_device_train_batch_size"] * steps_per_generation(cfg)
    if rollout % cfg["num_generations"]:
        out.append(f"per_device_train_batch_size × steps_per_generation = {rollout} completions per rank, not a "
                   f"multiple of num_generations={cfg['num_generations']}: each rank rolls out whole groups here")
    epochs = cfg["num_train_epochs"]
    if cfg["max_steps"] <= 0 and epochs != int(epochs):
        out.append(f"num_train_epochs={epochs}: use a whole number of epochs, or max_steps")
    if not float(cfg["logging_steps"]).is_integer() or cfg["logging_steps"] < 1:
        out.append(f"logging_steps={cfg['logging_steps']}: use a whole number of steps (not a fraction of the run)")
    return out


def min_lr_ratio(cfg: dict[str, Any]) -> float | None:
    """``cosine_with_min_lr``'s floor as a fraction of the learning rate (transformers' ``min_lr_rate``,
    or ``min_lr`` / ``learning_rate``), None when neither is given."""
    kwargs = cfg["lr_scheduler_kwargs"] or {}
    if "min_lr_rate" in kwargs:
        return float(kwargs["min_lr_rate"])
    return float(kwargs["min_lr"]) / cfg["learning_rate"] if "min_lr" in kwargs else None


def steps_per_generation(cfg: dict[str, Any]) -> int:
    """Optimizer steps per rollout (TRL: ``steps_per_generation``, by default ``gradient_accumulation_steps``;
    a real ``GRPOConfig`` has derived it from ``generation_batch_size`` when that was given)."""
    return cfg["steps_per_generation"] or cfg["gradient_accumulation_steps"]
