"""TRL's ``GRPOConfig`` fields as `lightning_rlpt.compat.trl` reads them, and a stand-in `GRPOConfig`.

Four tables, read from TRL 1.16's ``trl/trainer/grpo_config.py`` (``GRPOConfig``) and the
``transformers.TrainingArguments`` fields it inherits; together they hold every field of TRL 1.16's
``GRPOConfig`` (tests/parity/test_trl_fields.py enumerates the installed TRL's fields):

- `TRL_DEFAULTS`: the fields the converter maps, with TRL's defaults (what an absent field means);
- `REFUSED`: fields it cannot honour, with TRL's default values (accepted) and what to use instead;
- `IGNORED`: fields with no bearing on what is trained (logging, saving, the Hub, evaluation,
  speed, vLLM's own settings), each with the reason, accepted and ignored;
- `REMOVED`: fields of older TRL releases, refused by name with what to use instead.

`GRPOConfig` lets a TRL script run with TRL not installed (TRL is never a dependency): it takes
the fields of the three tables by keyword, refuses any other name as TRL's dataclass would, and
converts like the dict of the fields given.
"""
from __future__ import annotations

import difflib
from typing import Any

DOC = "docs/from_trl.md"

# Fields read from the config, with TRL's defaults (used when a dict or object lacks them). The suite
# checks them against the installed TRL's ``GRPOConfig()`` (tests/parity/test_trl_fields.py).
TRL_DEFAULTS: dict[str, Any] = dict(
    learning_rate=1e-6, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, seed=42,
    per_device_train_batch_size=8, gradient_accumulation_steps=1, steps_per_generation=None,
    generation_batch_size=None, num_generations=8, num_generations_eval=None, num_iterations=1, beta=0.0,
    epsilon=0.2, epsilon_high=None, loss_type="dapo", scale_rewards="group", importance_sampling_level="token",
    use_bias_correction_kl=True, multi_objective_aggregation="sum_then_normalize", entropy_coef=0.0,
    sapo_temperature_neg=1.05, sapo_temperature_pos=1.0, vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0,
    vespo_lambda_neg=2.0, max_completion_length=512, temperature=1.0, top_p=1.0, top_k=0,
    min_p=None, repetition_penalty=1.0, generation_kwargs=None, chat_template_kwargs=None, reward_weights=None,
    mask_truncated_completions=False, disable_dropout=False, top_entropy_quantile=1.0, gradient_checkpointing=True,
    shuffle_dataset=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask",
    vllm_importance_sampling_clip_max=3.0, vllm_importance_sampling_cap=None, max_steps=-1, num_train_epochs=3.0,
    logging_steps=10, bf16=None, fp16=False, lr_scheduler_type="linear", warmup_steps=0,
    lr_scheduler_kwargs=None, output_dir=None, use_cpu=False,
)

_ENTROPY = "no equivalent yet: Skywork-OR1's adaptive entropy control (a callback moving entropy_coef) is not built"
_STRATEGY = "choose the distribution on lightning.Trainer(strategy=...) (DDPStrategy(...), ModelParallelStrategy for FSDP2)"
_OPTIMIZER = "use RLModule(optimizer=functools.partial(...))"
_COMPILE = "no equivalent: compile the policy yourself (RLModule(model=torch.compile(...)) is not supported either)"
_DATA = "no equivalent on PromptDataModule (it shuffles with seed= and keeps every batch)"

# Fields this project cannot honour: (TRL's default values, what to use instead).
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_vllm": ((False,), "use a vLLM rollout engine on the Trainer (docs/vllm.md)"),
    "use_adaptive_entropy": ((False,), _ENTROPY),
    "delta": ((None,), "no equivalent: RLModule's dual_clip is DAPO's bound on negative advantages, not INTELLECT-2's"),
    "sync_ref_model": ((False,), "use a reference-reset callback (docs/callbacks.md)"),
    "off_policy_mask_threshold": ((None,), "no equivalent yet (DeepSeek-V3.2's off-policy sequence mask)"),
    "vllm_importance_sampling_clip_min": ((None,), "use rollout_correction with its upper cap only"),
    "max_tool_calling_iterations": ((None,), "use RLModule(tools=..., max_turns=...) (docs/agents.md)"),
    "cast_lm_head_to_fp32": ((False,), "use torch_dtype='float32' for the whole model"),
    "optim": (("adamw_torch", "adamw_torch_fused"), _OPTIMIZER),
    "optim_args": ((None,), _OPTIMIZER),
    "optim_target_modules": ((None,), _OPTIMIZER + " over the parameters you choose"),
    "adam_epsilon": ((1e-8,), "use RLModule(optimizer=functools.partial(torch.optim.AdamW, eps=...))"),
    "gradient_checkpointing_kwargs": ((None,), "use gradient_checkpointing=True (non-reentrant)"),
    "auto_find_batch_size": ((False,), "use per_device_train_batch_size, or micro_batch_size"),
    "average_tokens_across_devices": ((True,), "no equivalent: the loss always divides by the token counts of every rank"),
    "neftune_noise_alpha": ((None,), "no equivalent: NEFTune's embedding noise is not built"),
    "torch_compile": ((False,), _COMPILE), "torch_compile_backend": ((None,), _COMPILE),
    "torch_compile_mode": ((None,), _COMPILE),
    "tf32": ((None,), "call torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision) yourself"),
    "full_determinism": ((False,), "use lightning.seed_everything(seed, workers=True) and Trainer(deterministic=True)"),
    "data_seed": ((None,), "use PromptDataModule(seed=...) (the conversion passes seed there)"),
    "dataloader_drop_last": ((False,), _DATA), "dataloader_in_order": ((True,), _DATA),
    "train_sampling_strategy": (("random",), _DATA),
    "resume_from_checkpoint": ((None,), "use trainer.fit(module, datamodule=..., ckpt_path=...)"),
    "ignore_data_skip": ((False,), "no equivalent: a resumed run always skips the batches it had trained on"),
    "load_best_model_at_end": ((False,), "use a ModelCheckpoint callback and load its best_model_path"),
    "enable_jit_checkpoint": ((False,), "no equivalent (transformers' just-in-time checkpointing)"),
    "deepspeed": ((None,), _STRATEGY), "fsdp": ((None, "", []), _STRATEGY), "fsdp_config": ((None,), _STRATEGY),
    "parallelism_config": ((None,), _STRATEGY), "ddp_backend": ((None,), _STRATEGY),
    "ddp_find_unused_parameters": ((None,), _STRATEGY), "ddp_static_graph": ((None,), _STRATEGY),
    "ddp_bucket_cap_mb": ((None,), _STRATEGY), "ddp_broadcast_buffers": ((None,), _STRATEGY),
}

_OUTPUT = "what is logged, saved or pushed; Lightning's loggers and checkpoint callbacks decide that here"
_EVAL = "evaluation runs through validation_step with RLModule(val_generation=, val_samples=, val_pass_k=)"
_SPEED = "speed or memory only, not what is trained"
_LAUNCH = "set by the launcher, or accelerate's settings; Lightning's Trainer decides them here"
_INERT = "inert under GRPO in TRL too (no labels, no cross-entropy)"

# Fields with no bearing on what is trained, each group with why: accepted and ignored.
IGNORED: dict[str, str] = {
    **dict.fromkeys((
        "run_name", "report_to", "logging_strategy", "logging_first_step", "logging_nan_inf_filter", "save_steps",
        "save_strategy", "save_total_limit", "save_only_model", "save_on_each_node", "push_to_hub", "hub_model_id",
        "hub_private_repo", "hub_strategy", "hub_always_push", "hub_revision", "hub_token", "log_completions",
        "num_completions_to_print", "log_unique_prompts", "log_multimodal", "log_completions_hub_repo", "log_level",
        "log_level_replica", "log_on_each_node", "disable_tqdm", "project", "trackio_bucket_id", "trackio_space_id",
        "trackio_static_space_id", "skip_memory_metrics", "include_num_input_tokens_seen",
        "restore_callback_states_from_checkpoint", "debug"), _OUTPUT),
    **dict.fromkeys((
        "eval_strategy", "eval_steps", "do_eval", "do_train", "do_predict", "per_device_eval_batch_size",
        "bf16_full_eval", "fp16_full_eval", "eval_accumulation_steps", "eval_delay", "eval_do_concat_batches",
        "eval_on_start", "eval_use_gather_object", "batch_eval_metrics", "prediction_loss_only", "include_for_metrics",
        "metric_for_best_model", "greater_is_better"), _EVAL),
    **dict.fromkeys((
        "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
        "dataloader_multiprocessing_context", "ds3_gather_for_generation", "pad_to_multiple_of", "cache_implementation",
        "use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged",
        "use_liger_kernel", "liger_kernel_config", "torch_empty_cache_steps", "use_cache"), _SPEED),
    **dict.fromkeys(("local_rank", "ddp_timeout", "accelerator_config"), _LAUNCH),
    **dict.fromkeys(("label_smoothing_factor", "label_names", "length_column_name", "remove_unused_columns",
                     "router_aux_loss_coef"), _INERT),
    "model_init_kwargs": "the model is loaded by RLModule(model=..., torch_dtype=..., quantization=...)",
    "trust_remote_code": "the model is loaded by RLModule; pass a loaded nn.Module for remote code",
    "ref_model_mixup_alpha": "read only with sync_ref_model, which is refused",
    "ref_model_sync_steps": "read only with sync_ref_model, which is refused",
    **dict.fromkeys(("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"),
                    "read only with use_adaptive_entropy, which is refused"),
    **dict.fromkeys([f"vllm_{n}" for n in (
        "mode", "model_impl", "enable_sleep_mode", "structured_outputs_regex", "server_base_url", "server_host",
        "server_port", "server_timeout", "group_port", "gpu_memory_utilization", "max_model_length",
        "tensor_parallel_size")], "read only with use_vllm, which is refused (the engine is configured on its own)"),
}

# Fields older TRL releases had and TRL 1.16 does not: refused by name, with what to use instead.
REMOVED: dict[str, str] = {
    "max_prompt_length": "TRL 1.16 does not truncate prompts; use RLModule(generation=dict(max_prompt_length=...))",
    "warmup_ratio": "transformers reads a warmup_steps below 1 as the fraction of the run: give warmup_steps=0.1",
    "logging_dir": "use the logger's own directory (e.g. lightning.pytorch.loggers.TensorBoardLogger(save_dir=...))",
    "overwrite_output_dir": "not a field any more; Lightning never deletes output_dir",
    "use_liger_loss": "use RLModule(use_fused_kernel=True) (the default)",
}

KNOWN = frozenset(TRL_DEFAULTS) | frozenset(REFUSED) | frozenset(IGNORED)


def unknown_fields(names: Any) -> str | None:
    """A message naming the fields of ``names`` that TRL's ``GRPOConfig`` does not have (with the
    closest field for each), or None when all are known."""
    unknown = sorted(set(names) - KNOWN)
    if not unknown:
        return None
    removed = [f"{k}: not a field of TRL 1.16's GRPOConfig; {REMOVED[k]}" for k in unknown if k in REMOVED]
    if removed:
        return "; ".join(removed) + f" (see {DOC})"
    hints = {k: difflib.get_close_matches(k, KNOWN, n=1) for k in unknown}
    return (f"unknown GRPOConfig field(s) {unknown}" + "".join(f"; {k}: did you mean {v[0]!r}?"
                                                             for k, v in hints.items() if v) + f" (see {DOC})")


class GRPOConfig:
    """A stand-in for ``trl.GRPOConfig``, for a TRL script run without TRL installed.

    It holds the fields given, by keyword, as attributes; `from_grpo_config` converts it like the
    dict of those fields (an absent field takes TRL's default). A name TRL's ``GRPOConfig`` does
    not have is a ``TypeError`` here too, with the closest field; values are checked when converted.

    Args:
        **fields: ``GRPOConfig`` fields, e.g. ``beta=0.04, loss_type="dr_grpo", output_dir="runs/x"``.

    Examples:
        >>> GRPOConfig(beta=0.04, num_generations=4).beta
        0.04
        >>> GRPOConfig(betta=0.04)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: unknown GRPOConfig field(s) ['betta']; betta: did you mean 'beta'? (see docs/from_trl.md)
    """

    def __init__(self, **fields: Any):
        problem = unknown_fields(fields)
        if problem:
            raise TypeError(problem)
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"
