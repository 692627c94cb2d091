"""TRL's ``GRPOConfig`` read as `RLModule` / `PromptDataModule` / ``lightning.Trainer`` arguments.

`from_grpo_config` converts knob by knob (the table is docs/from_trl.md); TRL is never imported:
the config is read by its attribute names (a ``GRPOConfig``, this package's stand-in
`GRPOConfig`, any object with its attributes, or a dict of its fields). The converted arguments
reproduce TRL's behaviour, TRL's defaults included, where this project's defaults differ (β 0,
token-mean aggregation, the ``k3`` KL term, dropout kept). A field this project cannot honour is
refused by name with what to use instead when it is set to anything but TRL's default; left at
the default it is ignored (the tables: `lightning_rlpt.compat.trl_fields`; the value checks:
`lightning_rlpt.compat.trl_checks`).

`TRL_NAMES` maps TRL's argument names to `RLModule`'s; `RefusesTRLNames` makes ``RLModule(beta=...)``
fail with a ``TypeError`` that names the equivalent instead of Python's bare one.

Defaults and meanings were read from TRL's ``trl/trainer/grpo_config.py`` and ``grpo_trainer.py``.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from .trl_checks import (CORRECTION, LOSS_AGGREGATION, POLICY_LOSS, SCALE_REWARDS, VESPO_MODE, check_choices,
                         min_lr_ratio, scale_rewards, steps_per_generation)
from .trl_fields import DOC, IGNORED, KNOWN, REFUSED, REMOVED, TRL_DEFAULTS, GRPOConfig, unknown_fields

__all__ = ["CORRECTION", "DOC", "GRPOConfig", "IGNORED", "LOSS_AGGREGATION", "REFUSED", "REMOVED", "TRL_DEFAULTS", "TRL_NAMES",
           "TRLArgs", "RefusesTRLNames", "check_trl_names", "from_grpo_config"]

_SCHEDULE = "lr_scheduler=functools.partial(WarmupLinearLR or WarmupCosineLR, warmup_steps=...)"

# TRL argument name -> what to pass to RLModule instead (the TypeError's text). Names RLModule
# shares with TRL (entropy_coef, multi_objective_aggregation, reward_weights, ...) are not here.
TRL_NAMES: dict[str, str] = {
    "beta": "kl_coef",
    "num_generations": "group_size",
    "epsilon": "clip_low",
    "epsilon_high": "clip_high (for loss_type='cispo' TRL's cap is absolute: clip_high = epsilon_high - 1)",
    "loss_type": "policy_loss= and loss_aggregation= ('dapo' is loss_aggregation='token-mean')",
    "scale_rewards": "advantage= ('group' is advantage='grpo', 'batch' is 'grpo_batch_std', 'none' is 'dr_grpo')",
    "importance_sampling_level": "policy_loss='gspo' for 'sequence'",
    "max_completion_length": "generation=dict(max_new_tokens=...)",
    "max_prompt_length": "generation=dict(max_prompt_length=...)",
    "temperature": "generation=dict(temperature=...)",
    "generation_kwargs": "generation=dict(generation_kwargs=...)",
    "learning_rate": "lr",
    "num_iterations": "updates_per_rollout",
    "use_bias_correction_kl": "kl_estimator ('k3' is TRL's use_bias_correction_kl=False, 'k3_ratio' is True)",
    "sapo_temperature_pos": "policy_loss_kwargs=dict(temperature_pos=...)",
    "sapo_temperature_neg": "policy_loss_kwargs=dict(temperature_neg=...)",
    **{f"vespo_{k}": f"policy_loss_kwargs=dict({k}=...)" for k in ("k_pos", "lambda_pos", "k_neg", "lambda_neg")},
    "vllm_importance_sampling_mode": "rollout_correction",
    "vllm_importance_sampling_clip_max": "rollout_correction_cap",
    "per_device_train_batch_size": "PromptDataModule(batch_size=...) (prompts) and minibatch_size (sequences)",
    "lr_scheduler_type": _SCHEDULE,
    "warmup_steps": _SCHEDULE,
    "warmup_ratio": _SCHEDULE,
}


@dataclass
class TRLArgs:
    """Keyword arguments converted from a TRL ``GRPOConfig`` (see `from_grpo_config`).

    Args:
        module: for ``RLModule(model, reward_funcs, **args.module)``.
        data: for ``PromptDataModule(data, **args.data)``.
        trainer: for ``lightning.Trainer(**args.trainer)``.
    """

    module: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)


class RefusesTRLNames:
    """Mixin: a TRL argument name given to the class fails with a ``TypeError`` naming the
    equivalent (checked in ``__new__``, before Python's own error about ``__init__``)."""

    def __new__(cls, *args: Any, **kwargs: Any):
        check_trl_names(cls.__name__, kwargs)
        return super().__new__(cls)


def check_trl_names(owner: str, kwargs: dict[str, Any]) -> None:
    """Raise ``TypeError`` for the first keyword of ``kwargs`` that is TRL's name for an ``owner`` argument.

    Args:
        owner: the class name, for the message.
        kwargs: the keyword arguments given.

    Examples:
        >>> check_trl_names("RLModule", {"beta": 0.04})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: RLModule got `beta`, which is TRL's name; use `kl_coef` (see docs/from_trl.md)
    """
    for name in kwargs:
        if name in TRL_NAMES:
            use = TRL_NAMES[name]
            use = use if use.startswith("no equivalent") else f"use `{use}`"
            raise TypeError(f"{owner} got `{name}`, which is TRL's name; {use} (see {DOC})")


def from_grpo_config(config: Any) -> TRLArgs:
    """Convert a TRL ``GRPOConfig`` (or a dict of its fields) knob by knob.

    Meanings that differ are translated to ours: ``beta`` → ``kl_coef`` with TRL's default 0.0;
    ``loss_type`` selects the aggregation (``dapo``, TRL's default, is ``token-mean``; ``grpo`` is
    ``seq-mean-token-mean``; ``dr_grpo`` is ``seq-mean-token-sum-norm``; ``bnpo`` is ``bnpo``) and,
    for ``cispo``, ``sapo``, ``luspo`` and ``vespo``, the policy loss of that name; CISPO's
    ``epsilon_high`` is TRL's *absolute* cap on the IS weight, so ``clip_high = epsilon_high - 1``;
    ``scale_rewards`` selects the advantage (``group``: ``grpo``, ``batch``: ``grpo_batch_std``,
    both with TRL's ε 1e-4; ``none``: ``dr_grpo``), and ``multi_objective_aggregation=
    "normalize_then_sum"`` takes ``grpo_batch_std`` whatever ``scale_rewards`` says, as TRL does;
    ``use_bias_correction_kl=False`` is our ``k3``, True (TRL 1.16's default) our ``k3_ratio``, or
    ``k3_seq_ratio`` at ``importance_sampling_level="sequence"``; TRL's batch sizes count
    completions, ``PromptDataModule``'s counts prompts (``per_device_train_batch_size ×
    steps_per_generation / num_generations`` per rank), with ``minibatch_size`` the completions of
    one optimizer step and ``micro_batch_size`` those of one forward. A dict's unknown keys are
    refused (a typo); an object's attributes other than those read are ignored.

    Args:
        config: a ``trl.GRPOConfig``, `GRPOConfig`, an object with its attribute names, or a dict of its fields.

    Returns:
        `TRLArgs` with ``module``, ``data`` and ``trainer`` keyword arguments.

    Raises:
        ValueError: fields set to what this project cannot honour, each named with what to use.

    Examples:
        >>> args = from_grpo_config({"beta": 0.04, "loss_type": "grpo", "num_generations": 4,
        ...                          "per_device_train_batch_size": 8, "max_steps": 100})
        >>> args.module["kl_coef"], args.module["loss_aggregation"], args.data["batch_size"], args.trainer["max_steps"]
        (0.04, 'seq-mean-token-mean', 2, 100)
    """
    given = _fields(config)
    problems = [f"{name}={given[name]!r}: {use}" for name, (defaults, use) in REFUSED.items()
                if name in given and given[name] not in defaults]
    cfg = {**TRL_DEFAULTS, **{k: v for k, v in given.items() if k in TRL_DEFAULTS}}
    problems += check_choices(cfg)
    if problems:
        raise ValueError(f"this GRPOConfig cannot be honoured as given ({DOC}):\n  " + "\n  ".join(problems))
    return TRLArgs(module=_module(cfg), data=_data(cfg), trainer=_trainer(cfg))


def _fields(config: Any) -> dict[str, Any]:
    """The config's fields as a dict; a dict's unknown keys are refused (nothing checks them otherwise).
    A real ``GRPOConfig``'s fields that no table knows (a newer TRL's) are refused when set away from
    their default, so a knob is never dropped without a word."""
    if isinstance(config, dict):
        problem = unknown_fields(config)
        if problem:
            raise ValueError(problem)
        return dict(config)
    if dataclasses.is_dataclass(config):
        new = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
               if f.name not in KNOWN and getattr(config, f.name) != _default(f)]
        if new:
            raise ValueError(f"GRPOConfig field(s) {new} are not known to this version of lightning_rlpt (a newer TRL?): "
                             f"they are neither mapped nor refused nor ignored; leave them at their default (see {DOC})")
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name in KNOWN}
    return dict(vars(config))


def _default(f: dataclasses.Field) -> Any:
    """A dataclass field's declared default (its factory's value)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _module(cfg: dict[str, Any]) -> dict[str, Any]:
    """RLModule's keyword arguments (the objective and the optimization)."""
    b, accumulate = cfg["per_device_train_batch_size"], cfg["gradient_accumulation_steps"]
    out = dict(objective="grpo", group_size=cfg["num_generations"], kl_coef=float(cfg["beta"]),
               kl_estimator=_kl_estimator(cfg), **_advantage(cfg),
               loss_aggregation=LOSS_AGGREGATION[cfg["loss_type"]], **_policy_loss(cfg),
               entropy_coef=float(cfg["entropy_coef"]), multi_objective_aggregation=cfg["multi_objective_aggregation"],
               lr=cfg["learning_rate"], max_grad_norm=cfg["max_grad_norm"], seed=cfg["seed"],
               updates_per_rollout=cfg["num_iterations"], micro_batch_size=b,
               minibatch_size=None if accumulate >= steps_per_generation(cfg) else b * accumulate,
               disable_dropout=cfg["disable_dropout"], mask_truncated_completions=cfg["mask_truncated_completions"],
               top_entropy_quantile=cfg["top_entropy_quantile"], gradient_checkpointing=cfg["gradient_checkpointing"],
               generation=_generation(cfg), **_correction(cfg))
    if cfg["weight_decay"]:
        out["weight_decay"] = cfg["weight_decay"]
    if (cfg["adam_beta1"], cfg["adam_beta2"]) != (0.9, 0.999):
        out["betas"] = (cfg["adam_beta1"], cfg["adam_beta2"])
    if cfg["reward_weights"] is not None:
        out["reward_weights"] = list(cfg["reward_weights"])
    if cfg["num_generations_eval"] is not None:
        out["val_samples"] = cfg["num_generations_eval"]
    if cfg["lr_scheduler_type"] != "constant":
        out["lr_scheduler"] = _schedule(cfg)
    return out


def _kl_estimator(cfg: dict[str, Any]) -> str:
    """TRL's k3, times its importance ratio under ``use_bias_correction_kl`` (True by default in
    TRL 1.16): the token's ratio, or the sequence's at ``importance_sampling_level="sequence"``."""
    if not cfg["use_bias_correction_kl"]:
        return "k3"
    return "k3_seq_ratio" if cfg["importance_sampling_level"] == "sequence" else "k3_ratio"


def _advantage(cfg: dict[str, Any]) -> dict[str, Any]:
    """TRL scales by the group's or the batch's std with ε 1e-4 (ours 1e-6), or not at all;
    ``normalize_then_sum`` (GDPO) ends on the batch's std whatever ``scale_rewards`` says."""
    scale = "batch" if cfg["multi_objective_aggregation"] == "normalize_then_sum" else scale_rewards(cfg)
    return dict(advantage=SCALE_REWARDS[scale], advantage_kwargs={} if scale == "none" else {"eps": 1e-4})


def _policy_loss(cfg: dict[str, Any]) -> dict[str, Any]:
    """Policy loss, clip range and the loss's own settings: CISPO's ``epsilon_high`` is TRL's
    absolute cap, ours is ``1 + clip_high``; SAPO's temperatures and VESPO's kernel pass through."""
    loss, low = cfg["loss_type"], cfg["epsilon"]
    high = cfg["epsilon_high"] if cfg["epsilon_high"] is not None else low
    default = "gspo" if cfg["importance_sampling_level"] == "sequence" else "ppo_clip"
    out = dict(policy_loss=POLICY_LOSS.get(loss, default), clip_low=low,
               clip_high=high - 1.0 if loss == "cispo" else high)
    if loss == "sapo":
        out["policy_loss_kwargs"] = dict(temperature_pos=cfg["sapo_temperature_pos"],
                                         temperature_neg=cfg["sapo_temperature_neg"])
    elif loss == "vespo":
        out["policy_loss_kwargs"] = {k: cfg[f"vespo_{k}"] for k in ("k_pos", "lambda_pos", "k_neg", "lambda_neg")}
        # TRL's kernel reads the sampler ratio of its token mode (get_gamma_weights), none with the correction off
        out["policy_loss_kwargs"]["behaviour_cap"] = cfg["vllm_importance_sampling_cap"] or \
            cfg["vllm_importance_sampling_clip_max"]
        out["policy_loss_kwargs"]["behaviour_mode"] = VESPO_MODE.get(cfg["vllm_importance_sampling_mode"]) \
            if cfg["vllm_importance_sampling_correction"] else None
    return out


# generation_kwargs keys that override TRL's own sampling fields: moved into those fields here
# (SamplingConfig refuses them inside generation_kwargs, naming the field).
OVERRIDES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
             "repetition_penalty": "repetition_penalty", "max_tokens": "max_new_tokens",
             "max_new_tokens": "max_new_tokens"}


def _generation(cfg: dict[str, Any]) -> dict[str, Any]:
    """`SamplingConfig` fields; TRL 1.16 does not truncate prompts (its ``max_prompt_length`` is gone).
    ``generation_kwargs`` pass through, except the keys that override a sampling field in TRL,
    which set that field."""
    out = dict(max_new_tokens=cfg["max_completion_length"], temperature=cfg["temperature"], top_p=cfg["top_p"],
               top_k=cfg["top_k"] or 0, min_p=cfg["min_p"] or 0.0, repetition_penalty=cfg["repetition_penalty"],
               max_prompt_length=None)
    if cfg["chat_template_kwargs"] is not None:
        out["chat_template_kwargs"] = dict(cfg["chat_template_kwargs"])
    extra = dict(cfg["generation_kwargs"] or {})
    out.update({OVERRIDES[k]: extra.pop(k) for k in list(extra) if k in OVERRIDES})
    if extra:
        out["generation_kwargs"] = extra
    return out


def _correction(cfg: dict[str, Any]) -> dict[str, Any]:
    """TRL's vLLM importance-sampling correction as ``rollout_correction`` (acts only where the
    engine reports behaviour log-probs, as TRL's acts only with vLLM). VESPO corrects itself: its
    kernel weighs the sequence's ratio to the sampler, each token's truncated at TRL's cap
    (``behaviour_cap``, set in `_policy_loss`), as TRL's ``vespo`` does in ``token_truncate`` mode."""
    if not cfg["vllm_importance_sampling_correction"] or cfg["loss_type"] == "vespo":
        return dict(rollout_correction=None)
    cap = cfg["vllm_importance_sampling_cap"] or cfg["vllm_importance_sampling_clip_max"]
    return dict(rollout_correction=CORRECTION[cfg["vllm_importance_sampling_mode"]], rollout_correction_cap=cap)


def _schedule(cfg: dict[str, Any]) -> Any:
    """TRL's linear (its default) or cosine decay to 0 (``cosine_with_min_lr``: to its floor) after a
    warm-up; the length is left to the run (``max_steps``, or the epochs' steps), as TRL's follows its run."""
    from ..optim.schedules import WarmupCosineLR, WarmupLinearLR  # lazily: this module stays free of torch

    warmup = cfg["warmup_steps"]  # a float < 1 is a fraction of the run, as in transformers
    if cfg["lr_scheduler_type"] == "linear":
        return functools.partial(WarmupLinearLR, warmup_steps=warmup)
    if cfg["lr_scheduler_type"] == "cosine":
        return functools.partial(WarmupCosineLR, warmup_steps=warmup)
    return functools.partial(WarmupCosineLR, warmup_steps=warmup, min_lr_ratio=min_lr_ratio(cfg))


def _data(cfg: dict[str, Any]) -> dict[str, Any]:
    """PromptDataModule's: prompts per rank and rollout (TRL's batch sizes count completions)."""
    completions = cfg["per_device_train_batch_size"] * steps_per_generation(cfg)
    return dict(batch_size=completions // cfg["num_generations"], shuffle=cfg["shuffle_dataset"], seed=cfg["seed"])


def _trainer(cfg: dict[str, Any]) -> dict[str, Any]:
    """lightning.Trainer's: length, logging cadence, where to write, precision (TRL's bf16 default:
    on unless fp16)."""
    out: dict[str, Any] = dict(log_every_n_steps=int(cfg["logging_steps"]))
    if cfg["max_steps"] > 0:
        out["max_steps"] = cfg["max_steps"]
    else:
        out["max_epochs"] = int(cfg["num_train_epochs"])
    if cfg["output_dir"] is not None:
        out["default_root_dir"] = str(cfg["output_dir"])
    if cfg["use_cpu"]:
        out["accelerator"] = "cpu"
    if cfg["fp16"]:
        out["precision"] = "16-mixed"
    elif cfg["bf16"] or cfg["bf16"] is None:
        out["precision"] = "bf16-mixed"
    return out
