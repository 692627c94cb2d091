"""TRL's ``GRPOConfig`` fields as `lightning_rlpt.compat.trl` reads them, and a stand-in `GRPOConfig`.

Three tables, read from TRL's ``trl/trainer/grpo_config.py`` (``GRPOConfig``) and the
``transformers.TrainingArguments`` fields it inherits:

- `TRL_DEFAULTS`: the fields the converter maps, with TRL's defaults (what an absent field means);
- `REFUSED`: fields it cannot honour, with TRL's default values (accepted) and what to use instead;
- `IGNORED`: fields with no bearing on what is trained (logging, saving, the Hub, vLLM's own
  settings), accepted and ignored.

`GRPOConfig` lets a TRL script run with TRL not installed (TRL is never a dependency): it takes
the fields of the three tables by keyword, refuses any other name as TRL's dataclass would, and
converts like the dict of the fields given.
"""
from __future__ import annotations

import difflib
from typing import Any

DOC = "docs/from_trl.md"

# Fields read from the config, with TRL's defaults (used when a dict or object lacks them).
TRL_DEFAULTS: dict[str, Any] = dict(
    learning_rate=1e-6, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, seed=42,
    per_device_train_batch_size=8, gradient_accumulation_steps=1, steps_per_generation=None,
    generation_batch_size=None, num_generations=8, num_generations_eval=None, num_iterations=1, beta=0.0,
    epsilon=0.2, epsilon_high=None, loss_type="dapo", scale_rewards="group", importance_sampling_level="token",
    use_bias_correction_kl=False, multi_objective_aggregation="sum_then_normalize", entropy_coef=0.0,
    sapo_temperature_neg=1.05, sapo_temperature_pos=1.0, vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0,
    vespo_lambda_neg=2.0, max_completion_length=512, max_prompt_length=None, temperature=1.0, top_p=1.0, top_k=0,
    min_p=None, repetition_penalty=1.0, generation_kwargs=None, chat_template_kwargs=None, reward_weights=None,
    mask_truncated_completions=False, disable_dropout=False, top_entropy_quantile=1.0, gradient_checkpointing=True,
    shuffle_dataset=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask",
    vllm_importance_sampling_clip_max=3.0, vllm_importance_sampling_cap=None, max_steps=-1, num_train_epochs=3.0,
    logging_steps=10, bf16=None, fp16=False, lr_scheduler_type="linear", warmup_steps=0, warmup_ratio=0.0,
    lr_scheduler_kwargs=None, output_dir=None,
)

_ENTROPY = "no equivalent yet: Skywork-OR1's adaptive entropy control (a callback moving entropy_coef) is not built"

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
    "optim": (("adamw_torch", "adamw_torch_fused"), "use RLModule(optimizer=functools.partial(...))"),
    "adam_epsilon": ((1e-8,), "use RLModule(optimizer=functools.partial(torch.optim.AdamW, eps=...))"),
    "gradient_checkpointing_kwargs": ((None,), "use gradient_checkpointing=True (non-reentrant)"),
    "auto_find_batch_size": ((False,), "use per_device_train_batch_size, or micro_batch_size"),
}

IGNORED = frozenset({
    "run_name", "report_to", "logging_dir", "logging_strategy", "logging_first_step", "save_steps",
    "save_strategy", "save_total_limit", "save_only_model", "push_to_hub", "hub_model_id", "hub_private_repo",
    "hub_strategy", "eval_strategy", "eval_steps", "do_eval", "do_train", "per_device_eval_batch_size",
    "dataloader_num_workers", "remove_unused_columns", "log_completions", "num_completions_to_print",
    "log_unique_prompts", "log_multimodal", "log_completions_hub_repo", "log_level", "ds3_gather_for_generation",
    "model_init_kwargs", "trust_remote_code", "use_liger_kernel", "use_liger_loss", "router_aux_loss_coef",
    "pad_to_multiple_of", "cache_implementation", "ref_model_mixup_alpha", "ref_model_sync_steps",
    "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target",
    "bf16_full_eval", "fp16_full_eval", "use_transformers_continuous_batching",
    "transformers_continuous_batching_config", "use_transformers_paged", "overwrite_output_dir",
}) | frozenset(f"vllm_{n}" for n in (
    "mode", "model_impl", "enable_sleep_mode", "structured_outputs_regex", "server_base_url", "server_host",
    "server_port", "server_timeout", "group_port", "gpu_memory_utilization", "max_model_length",
    "tensor_parallel_size"))

KNOWN = frozenset(TRL_DEFAULTS) | frozenset(REFUSED) | IGNORED


def unknown_fields(names: Any) -> str | None:
    """A message naming the fields of ``names`` that TRL's ``GRPOConfig`` does not have (with the
    closest field for each), or None when all are known."""
    unknown = sorted(set(names) - KNOWN)
    if not unknown:
        return None
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

    Example:
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
