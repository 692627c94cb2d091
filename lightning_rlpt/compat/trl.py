"""TRL's ``GRPOConfig`` read as `RLModule` / `PromptDataModule` / ``lightning.Trainer`` arguments.

`from_grpo_config` converts knob by knob (the table is docs/from_trl.md); TRL is never imported:
the config is read by its attribute names (a ``GRPOConfig``, any object with its attributes, or
a dict of its fields). The converted arguments reproduce TRL's behaviour, TRL's defaults
included, where this project's defaults differ (β 0, token-mean aggregation, dropout kept, no
prompt truncation). A field this project cannot honour is refused by name with what to use
instead when it is set to anything but TRL's default; left at the default it is ignored.

`TRL_NAMES` maps TRL's argument names to `RLModule`'s; `RefusesTRLNames` makes ``RLModule(beta=...)``
fail with a ``TypeError`` that names the equivalent instead of Python's bare one.

Defaults and meanings were read from TRL's ``trl/trainer/grpo_config.py`` and ``grpo_trainer.py``.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
from dataclasses import dataclass, field
from typing import Any

DOC = "docs/from_trl.md"

# TRL argument name -> what to pass to RLModule instead (the TypeError's text).
TRL_NAMES: dict[str, str] = {
    "beta": "kl_coef",
    "num_generations": "group_size",
    "epsilon": "clip_low",
    "epsilon_high": "clip_high (for loss_type='cispo' TRL's cap is absolute: clip_high = epsilon_high - 1)",
    "loss_type": "objective= or loss_aggregation= ('dapo' is loss_aggregation='token-mean')",
    "scale_rewards": "advantage= ('group' is advantage='grpo', 'none' is advantage='dr_grpo')",
    "importance_sampling_level": "policy_loss='gspo' for 'sequence'",
    "max_completion_length": "generation=dict(max_new_tokens=...)",
    "max_prompt_length": "generation=dict(max_prompt_length=...)",
    "temperature": "generation=dict(temperature=...)",
    "learning_rate": "lr",
    "num_iterations": "updates_per_rollout",
    "use_bias_correction_kl": "kl_estimator ('k3' is TRL's use_bias_correction_kl=False)",
    "vllm_importance_sampling_mode": "rollout_correction",
    "vllm_importance_sampling_clip_max": "rollout_correction_cap",
    "per_device_train_batch_size": "PromptDataModule(batch_size=...) (prompts) and minibatch_size (sequences)",
}

# Fields read from the config, with TRL's defaults (used when a dict or object lacks them).
TRL_DEFAULTS: dict[str, Any] = dict(
    learning_rate=1e-6, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, seed=42,
    per_device_train_batch_size=8, gradient_accumulation_steps=1, steps_per_generation=None, num_generations=8,
    num_generations_eval=None, num_iterations=1, beta=0.0, epsilon=0.2, epsilon_high=None, loss_type="dapo",
    scale_rewards="group", importance_sampling_level="token", use_bias_correction_kl=False,
    max_completion_length=512, max_prompt_length=None, temperature=1.0, top_p=1.0, top_k=0, min_p=None,
    repetition_penalty=1.0, chat_template_kwargs=None, reward_weights=None, mask_truncated_completions=False,
    disable_dropout=False, top_entropy_quantile=1.0, gradient_checkpointing=True, shuffle_dataset=True,
    vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask",
    vllm_importance_sampling_clip_max=3.0, vllm_importance_sampling_cap=None, max_steps=-1, num_train_epochs=3.0,
    logging_steps=10, bf16=None, fp16=False, lr_scheduler_type="linear", warmup_steps=0, warmup_ratio=0.0,
)

# Fields this project cannot honour: (TRL's default values, what to use instead).
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_vllm": ((False,), "use a vLLM rollout engine on the Trainer (docs/vllm.md)"),
    "generation_kwargs": ((None,), "use generation=dict(...) with SamplingConfig's fields (a passthrough is planned "
                                   "in issue 26)"),
    "entropy_coef": ((0.0,), "no equivalent yet: an entropy bonus is planned in issue 26"),
    "use_adaptive_entropy": ((False,), "no equivalent yet: an entropy bonus is planned in issue 26"),
    "multi_objective_aggregation": (("sum_then_normalize",), "use the default (weighted sum, then advantages); "
                                                              "normalize_then_sum is planned in issue 26"),
    "delta": ((None,), "no equivalent: RLModule's dual_clip is DAPO's bound on negative advantages, not INTELLECT-2's"),
    "sync_ref_model": ((False,), "use a reference-reset callback (docs/callbacks.md)"),
    "off_policy_mask_threshold": ((None,), "no equivalent yet (DeepSeek-V3.2's off-policy sequence mask)"),
    "vllm_importance_sampling_clip_min": ((None,), "use rollout_correction with its upper cap only"),
    "generation_batch_size": ((None,), "use steps_per_generation (prompts per rollout follow from it)"),
    "max_tool_calling_iterations": ((None,), "use RLModule(tools=..., max_turns=...) (docs/agents.md)"),
    "cast_lm_head_to_fp32": ((False,), "use torch_dtype='float32' for the whole model"),
    "optim": (("adamw_torch", "adamw_torch_fused"), "use RLModule(optimizer=functools.partial(...))"),
    "adam_epsilon": ((1e-8,), "use RLModule(optimizer=functools.partial(torch.optim.AdamW, eps=...))"),
    "gradient_checkpointing_kwargs": ((None,), "use gradient_checkpointing=True (non-reentrant)"),
    "auto_find_batch_size": ((False,), "use per_device_train_batch_size, or micro_batch_size"),
}

# Fields with no bearing on what is trained (logging, saving, the Hub, vLLM's own settings):
# accepted in a dict and ignored.
IGNORED = frozenset({
    "output_dir", "run_name", "report_to", "logging_dir", "logging_strategy", "save_steps", "save_strategy",
    "save_total_limit", "save_only_model", "push_to_hub", "hub_model_id", "hub_private_repo", "eval_strategy",
    "eval_steps", "do_eval", "per_device_eval_batch_size", "dataloader_num_workers", "remove_unused_columns",
    "log_completions", "num_completions_to_print", "log_unique_prompts", "log_multimodal",
    "log_completions_hub_repo", "log_level", "ds3_gather_for_generation", "model_init_kwargs", "trust_remote_code",
    "use_liger_kernel", "use_liger_loss", "router_aux_loss_coef", "pad_to_multiple_of", "cache_implementation",
    "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
    "vespo_lambda_neg", "ref_model_mixup_alpha", "ref_model_sync_steps", "entropy_coef_min", "entropy_coef_max",
    "entropy_coef_delta", "entropy_target", "lr_scheduler_kwargs", "bf16_full_eval", "fp16_full_eval",
    "use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged",
}) | frozenset(f"vllm_{n}" for n in (
    "mode", "model_impl", "enable_sleep_mode", "structured_outputs_regex", "server_base_url", "server_host",
    "server_port", "server_timeout", "group_port", "gpu_memory_utilization", "max_model_length",
    "tensor_parallel_size"))

LOSS_AGGREGATION = {"dapo": "token-mean", "cispo": "token-mean", "grpo": "seq-mean-token-mean",
                    "dr_grpo": "seq-mean-token-sum-norm"}
NOT_YET = {"bnpo": "loss_type='dapo' (token-mean over the mini-batch on all ranks)",
           "sapo": "another policy loss (docs/objectives.md); sapo is planned in issue 26",
           "luspo": "loss_type='grpo' with importance_sampling_level='sequence' (GSPO); luspo is planned in issue 26",
           "vespo": "another policy loss (docs/objectives.md); vespo is planned in issue 26"}
CORRECTION = {"token_truncate": "token_tis", "token_mask": "token_mis", "sequence_truncate": "seq_tis",
              "sequence_mask": "seq_mis"}


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

    Example:
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
    ``seq-mean-token-mean``; ``dr_grpo`` is ``seq-mean-token-sum-norm``) and for ``cispo`` the
    policy loss, whose ``epsilon_high`` is TRL's *absolute* cap on the IS weight, so
    ``clip_high = epsilon_high - 1``; ``scale_rewards`` selects the advantage (``group``:
    ``grpo`` with TRL's ε 1e-4, ``none``: ``dr_grpo``); ``use_bias_correction_kl=False`` is our
    ``k3``, True our ``k1`` (the same gradient as k3 × ratio); TRL's batch sizes count
    completions, ``PromptDataModule``'s counts prompts (``per_device_train_batch_size ×
    steps_per_generation / num_generations`` per rank), with ``minibatch_size`` the completions of
    one optimizer step and ``micro_batch_size`` those of one forward. A dict's unknown keys are
    refused (a typo); an object's attributes other than those read are ignored.

    Args:
        config: a ``trl.GRPOConfig``, an object with its attribute names, or a dict of its fields.

    Returns:
        `TRLArgs` with ``module``, ``data`` and ``trainer`` keyword arguments.

    Raises:
        ValueError: fields set to what this project cannot honour, each named with what to use.

    Example:
        >>> args = from_grpo_config({"beta": 0.04, "loss_type": "grpo", "num_generations": 4,
        ...                          "per_device_train_batch_size": 8, "max_steps": 100})
        >>> args.module["kl_coef"], args.module["loss_aggregation"], args.data["batch_size"], args.trainer["max_steps"]
        (0.04, 'seq-mean-token-mean', 2, 100)
    """
    given = _fields(config)
    problems = [f"{name}={given[name]!r}: {use}" for name, (defaults, use) in REFUSED.items()
                if name in given and given[name] not in defaults]
    cfg = {**TRL_DEFAULTS, **{k: v for k, v in given.items() if k in TRL_DEFAULTS}}
    problems += _check_choices(cfg)
    if problems:
        raise ValueError(f"this GRPOConfig cannot be honoured as given ({DOC}):\n  " + "\n  ".join(problems))
    return TRLArgs(module=_module(cfg), data=_data(cfg), trainer=_trainer(cfg))


def _fields(config: Any) -> dict[str, Any]:
    """The config's fields as a dict; a dict's unknown keys are refused (nothing checks them otherwise)."""
    if isinstance(config, dict):
        known = set(TRL_DEFAULTS) | set(REFUSED) | IGNORED
        unknown = sorted(set(config) - known)
        if unknown:
            hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
            raise ValueError(f"unknown GRPOConfig field(s) {unknown}" + "".join(
                f"; {k}: did you mean {v[0]!r}?" for k, v in hints.items() if v) + f" (see {DOC})")
        return dict(config)
    if dataclasses.is_dataclass(config):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return dict(vars(config))


def _check_choices(cfg: dict[str, Any]) -> list[str]:
    """Values of mapped fields that have no equivalent here, each with what to use."""
    out = []
    loss, level = cfg["loss_type"], cfg["importance_sampling_level"]
    if loss in NOT_YET:
        out.append(f"loss_type={loss!r}: use {NOT_YET[loss]}")
    elif loss not in LOSS_AGGREGATION:
        out.append(f"loss_type={loss!r}: use one of {sorted(LOSS_AGGREGATION)}")
    if loss == "cispo" and (cfg["epsilon_high"] is None or cfg["epsilon_high"] <= 1):
        out.append(f"epsilon_high={cfg['epsilon_high']!r} with loss_type='cispo': TRL reads it as the absolute cap on "
                   "the IS weight; set it > 1 (ScaleRL recommends 5.0)")
    if level not in ("token", "sequence") or (level == "sequence" and loss == "cispo"):
        out.append(f"importance_sampling_level={level!r} with loss_type={loss!r}: use 'token', or 'sequence' (GSPO) "
                   "with loss_type 'grpo', 'dapo' or 'dr_grpo'")
    if {True: "group", False: "none"}.get(cfg["scale_rewards"], cfg["scale_rewards"]) not in ("group", "none"):
        out.append(f"scale_rewards={cfg['scale_rewards']!r}: use 'group' or 'none' ('batch' is planned in issue 26)")
    if cfg["vllm_importance_sampling_mode"] not in CORRECTION:
        out.append(f"vllm_importance_sampling_mode={cfg['vllm_importance_sampling_mode']!r}: use one of "
                   f"{sorted(CORRECTION)}")
    if cfg["lr_scheduler_type"] not in ("linear", "constant", "cosine"):
        out.append(f"lr_scheduler_type={cfg['lr_scheduler_type']!r}: use 'cosine' or 'constant', or "
                   "RLModule(lr_scheduler=...)")
    elif cfg["lr_scheduler_type"] != "cosine" and (cfg["warmup_steps"] or cfg["warmup_ratio"]):
        out.append(f"warmup with lr_scheduler_type={cfg['lr_scheduler_type']!r}: use lr_scheduler_type='cosine' "
                   "(lightning_rlpt.optim.WarmupCosineLR)")
    elif cfg["lr_scheduler_type"] == "cosine" and cfg["max_steps"] <= 0:
        out.append("lr_scheduler_type='cosine' without max_steps: set max_steps (the schedule's length)")
    out += _check_batch(cfg)
    return out


def _check_batch(cfg: dict[str, Any]) -> list[str]:
    rollout = cfg["per_device_train_batch_size"] * _steps_per_generation(cfg)
    out = []
    if rollout % cfg["num_generations"]:
        out.append(f"per_device_train_batch_size × steps_per_generation = {rollout} completions per rank, not a "
                   f"multiple of num_generations={cfg['num_generations']}: each rank rolls out whole groups here")
    epochs = cfg["num_train_epochs"]
    if cfg["max_steps"] <= 0 and epochs != int(epochs):
        out.append(f"num_train_epochs={epochs}: use a whole number of epochs, or max_steps")
    if not float(cfg["logging_steps"]).is_integer() or cfg["logging_steps"] < 1:
        out.append(f"logging_steps={cfg['logging_steps']}: use a whole number of steps (not a fraction of the run)")
    return out


def _steps_per_generation(cfg: dict[str, Any]) -> int:
    return cfg["steps_per_generation"] or cfg["gradient_accumulation_steps"]


def _module(cfg: dict[str, Any]) -> dict[str, Any]:
    """RLModule's keyword arguments (the objective and the optimization)."""
    b, accumulate = cfg["per_device_train_batch_size"], cfg["gradient_accumulation_steps"]
    scale = {True: "group", False: "none"}.get(cfg["scale_rewards"], cfg["scale_rewards"])
    out = dict(objective="grpo", group_size=cfg["num_generations"], kl_coef=float(cfg["beta"]),
               kl_estimator="k1" if cfg["use_bias_correction_kl"] else "k3",
               advantage="grpo" if scale == "group" else "dr_grpo",
               advantage_kwargs={"eps": 1e-4} if scale == "group" else {},
               loss_aggregation=LOSS_AGGREGATION[cfg["loss_type"]], **_clip(cfg),
               lr=cfg["learning_rate"], max_grad_norm=cfg["max_grad_norm"], seed=cfg["seed"],
               updates_per_rollout=cfg["num_iterations"], micro_batch_size=b,
               minibatch_size=None if accumulate >= _steps_per_generation(cfg) else b * accumulate,
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
    if cfg["lr_scheduler_type"] == "cosine":
        out["lr_scheduler"] = _cosine(cfg)
    return out


def _clip(cfg: dict[str, Any]) -> dict[str, Any]:
    """Policy loss and clip range: CISPO's ``epsilon_high`` is TRL's absolute cap, ours is ``1 + clip_high``."""
    low = cfg["epsilon"]
    high = cfg["epsilon_high"] if cfg["epsilon_high"] is not None else low
    if cfg["loss_type"] == "cispo":
        return dict(policy_loss="cispo", clip_low=low, clip_high=high - 1.0)
    loss = "gspo" if cfg["importance_sampling_level"] == "sequence" else "ppo_clip"
    return dict(policy_loss=loss, clip_low=low, clip_high=high)


def _generation(cfg: dict[str, Any]) -> dict[str, Any]:
    """`SamplingConfig` fields; TRL does not truncate prompts unless ``max_prompt_length`` is given."""
    out = dict(max_new_tokens=cfg["max_completion_length"], temperature=cfg["temperature"], top_p=cfg["top_p"],
               top_k=cfg["top_k"] or 0, min_p=cfg["min_p"] or 0.0, repetition_penalty=cfg["repetition_penalty"],
               max_prompt_length=cfg["max_prompt_length"])
    if cfg["chat_template_kwargs"] is not None:
        out["chat_template_kwargs"] = dict(cfg["chat_template_kwargs"])
    return out


def _correction(cfg: dict[str, Any]) -> dict[str, Any]:
    """TRL's vLLM importance-sampling correction as ``rollout_correction`` (acts only where the
    engine reports behaviour log-probs, as TRL's acts only with vLLM)."""
    if not cfg["vllm_importance_sampling_correction"]:
        return dict(rollout_correction=None)
    cap = cfg["vllm_importance_sampling_cap"] or cfg["vllm_importance_sampling_clip_max"]
    return dict(rollout_correction=CORRECTION[cfg["vllm_importance_sampling_mode"]], rollout_correction_cap=cap)


def _cosine(cfg: dict[str, Any]) -> Any:
    from ..optim.schedules import WarmupCosineLR  # lazily: this module stays free of torch

    warmup = cfg["warmup_steps"] or int(cfg["warmup_ratio"] * cfg["max_steps"])
    return functools.partial(WarmupCosineLR, total_steps=cfg["max_steps"], warmup_steps=warmup)


def _data(cfg: dict[str, Any]) -> dict[str, Any]:
    """PromptDataModule's: prompts per rank and rollout (TRL's batch sizes count completions)."""
    completions = cfg["per_device_train_batch_size"] * _steps_per_generation(cfg)
    return dict(batch_size=completions // cfg["num_generations"], shuffle=cfg["shuffle_dataset"], seed=cfg["seed"])


def _trainer(cfg: dict[str, Any]) -> dict[str, Any]:
    """lightning.Trainer's: length, logging cadence and precision (TRL's bf16 default: on unless fp16)."""
    out: dict[str, Any] = dict(log_every_n_steps=int(cfg["logging_steps"]))
    if cfg["max_steps"] > 0:
        out["max_steps"] = cfg["max_steps"]
    else:
        out["max_epochs"] = int(cfg["num_train_epochs"])
    if cfg["fp16"]:
        out["precision"] = "16-mixed"
    elif cfg["bf16"] or cfg["bf16"] is None:
        out["precision"] = "bf16-mixed"
    return out
