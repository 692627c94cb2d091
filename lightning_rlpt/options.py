"""`RLModule`'s arguments in the groups users think in: what model, what objective, what rewards,
how much memory, how to optimise, how to validate, what agent, how to checkpoint.

Each group is a small frozen dataclass whose fields are `RLModule`'s own argument names, so there
is one vocabulary and one set of defaults (the constructor's); a field left out keeps that
default. The flat names stay accepted, and are what the hyper-parameters, checkpoints and
LightningCLI configs record::

    RLModule("Qwen/Qwen2.5-0.5B", reward_funcs=[accuracy],
             objective=ObjectiveOptions("dapo", kl_coef=0.0),
             loading=LoadingOptions(lora=dict(r=16), quantization="nf4"),
             memory=MemoryOptions(micro_batch_size=4, gradient_checkpointing=True),
             optimization=OptimizationOptions(lr=1e-6, updates_per_rollout=2))

is ``RLModule(..., objective="dapo", kl_coef=0.0, lora=dict(r=16), quantization="nf4",
micro_batch_size=4, gradient_checkpointing=True, lr=1e-6, updates_per_rollout=2)``. A setting given
both flat and in a group is refused when the two disagree, so neither silently wins.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from .compat.trl import RefusesTRLNames


class _Unset:
    """A group field left out: the constructor's default applies."""

    def __repr__(self) -> str:
        return "UNSET"

    def __deepcopy__(self, memo: dict) -> "_Unset":
        return self


UNSET: Any = _Unset()


class OptionGroup(RefusesTRLNames):
    """Base of the groups: ``MemoryOptions(beta=...)`` names TRL's equivalent, as `RLModule` does."""

    def given(self) -> dict[str, Any]:
        """The fields that were set."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not UNSET}


@dataclass(frozen=True)
class LoadingOptions(OptionGroup):
    """How the policy is loaded: its tokenizer, adapters, quantization, dtype and dropout."""
    tokenizer: Any = UNSET
    lora: Any = UNSET
    quantization: Any = UNSET
    torch_dtype: Any = UNSET
    disable_dropout: Any = UNSET


@dataclass(frozen=True)
class ObjectiveOptions(OptionGroup):
    """What the update optimises: a preset and its overrides, the KL and entropy terms, the
    reference model, the off-policy correction."""
    objective: Any = UNSET
    kl_coef: Any = UNSET
    kl_estimator: Any = UNSET
    advantage: Any = UNSET
    policy_loss: Any = UNSET
    loss_aggregation: Any = UNSET
    clip_low: Any = UNSET
    clip_high: Any = UNSET
    dual_clip: Any = UNSET
    advantage_kwargs: Any = UNSET
    policy_loss_kwargs: Any = UNSET
    entropy_coef: Any = UNSET
    top_entropy_quantile: Any = UNSET
    mask_truncated_completions: Any = UNSET
    reference: Any = UNSET
    rollout_correction: Any = UNSET
    rollout_correction_cap: Any = UNSET
    rollout_correction_kl: Any = UNSET


@dataclass(frozen=True)
class RewardOptions(OptionGroup):
    """How the reward functions' scores are combined, bounded in time, and counted as successes."""
    reward_weights: Any = UNSET
    multi_objective_aggregation: Any = UNSET
    reward_on_error: Any = UNSET
    reward_timeout: Any = UNSET
    success_threshold: Any = UNSET


@dataclass(frozen=True)
class MemoryOptions(OptionGroup):
    """What bounds a step's memory: micro-batches, packing, activation checkpointing, the head's
    kernel and gradient path, the reference's dtype and placement."""
    micro_batch_size: Any = UNSET
    max_tokens_per_micro_batch: Any = UNSET
    padding_free: Any = UNSET
    gradient_checkpointing: Any = UNSET
    use_fused_kernel: Any = UNSET
    head_gradient: Any = UNSET
    reference_dtype: Any = UNSET
    reference_offload: Any = UNSET


@dataclass(frozen=True)
class OptimizationOptions(OptionGroup):
    """The optimizer, its schedule and clipping, and how each rollout is cut into steps."""
    updates_per_rollout: Any = UNSET
    minibatch_size: Any = UNSET
    optimizer: Any = UNSET
    lr_scheduler: Any = UNSET
    lr: Any = UNSET
    weight_decay: Any = UNSET
    betas: Any = UNSET
    max_grad_norm: Any = UNSET


@dataclass(frozen=True)
class ValidationOptions(OptionGroup):
    """Validation's sampling, samples per prompt and pass@k."""
    val_generation: Any = UNSET
    val_samples: Any = UNSET
    val_pass_k: Any = UNSET


@dataclass(frozen=True)
class AgentOptions(OptionGroup):
    """Multi-turn episodes: tools, an environment or a rollout function (docs/agents.md)."""
    tools: Any = UNSET
    max_turns: Any = UNSET
    tool_timeout: Any = UNSET
    tool_max_chars: Any = UNSET
    tool_parser: Any = UNSET
    environment: Any = UNSET
    rollout_func: Any = UNSET


@dataclass(frozen=True)
class CheckpointOptions(OptionGroup):
    """What a resumed fit may change, and per-tensor checksums (docs/checkpoints.md)."""
    resume_overrides: Any = UNSET
    checkpoint_checksums: Any = UNSET


# The constructor's keyword for each group. `objective` takes a preset name or its group.
GROUPS: dict[str, type[OptionGroup]] = {
    "loading": LoadingOptions, "objective": ObjectiveOptions, "rewards": RewardOptions,
    "memory": MemoryOptions, "optimization": OptimizationOptions, "validation": ValidationOptions,
    "agent": AgentOptions, "checkpointing": CheckpointOptions,
}
GROUP_ONLY = tuple(name for name in GROUPS if name != "objective")  # keywords that are only groups


def ungroup(arguments: dict[str, Any], init: Callable) -> tuple[dict[str, Any], dict[str, Any]]:
    """``init``'s flat arguments with every group in ``arguments`` spread into them, and the
    settings that came from groups.

    Args:
        arguments: the constructor's arguments by name (flat ones and groups; others are ignored).
        init: the constructor, whose signature gives the flat names and their defaults.

    Raises:
        TypeError: a group keyword holds something other than its group (or, for ``objective``, a name).
        ValueError: a setting given flat and in a group with different values.
    """
    params = {n: p for n, p in inspect.signature(init).parameters.items() if n not in GROUP_ONLY and n != "self"}
    flat = {n: arguments[n] for n in params}
    grouped: dict[str, Any] = {}
    for keyword, group in GROUPS.items():
        value = arguments.get(keyword)
        if value is None or (keyword == "objective" and isinstance(value, str)):
            continue
        if not isinstance(value, group):
            what = ("an " if group.__name__[0] in "AEIOU" else "a ") + group.__name__
            what += " or a preset name" if keyword == "objective" else ""
            raise TypeError(f"{keyword}= takes {what} (lightning_rlpt.options), got {type(value).__name__}")
        if keyword == "objective":
            flat["objective"] = grouped["objective"] = params["objective"].default
        for name, setting in value.given().items():
            if _differs(flat[name], params[name].default) and _differs(flat[name], setting):
                raise ValueError(f"{name} is given twice, {flat[name]!r} flat and {setting!r} in "
                                 f"{keyword}={group.__name__}(...): give it once")
            flat[name] = grouped[name] = setting
    return flat, grouped


def _differs(a: Any, b: Any) -> bool:
    """Whether two settings differ (so a flat value and a group's are not the same setting twice)."""
    if a is b:
        return False
    try:
        return bool(a != b)
    except Exception:  # a value without a plain equality (an array, a config object): treat as different
        return True


def record_flat(module: Any, grouped: dict[str, Any]) -> None:
    """Store the settings that came from groups under their flat names in the module's
    hyper-parameters (and the copy loggers log): what a checkpoint and a CLI config keep. The
    others stay as Lightning recorded them (a LightningCLI run: as its config wrote them); the
    group keywords themselves are left out by ``save_hyperparameters(ignore=GROUP_ONLY)``."""
    for store in (module.hparams, module._hparams_initial):  # Lightning keeps the initial copy for loggers
        store.update({name: value for name, value in grouped.items() if name in store})
