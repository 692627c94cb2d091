"""Objective presets: a name fills in the policy loss, advantage estimator, aggregation, clip
ranges and KL coefficient. Any explicit `RLModule` argument overrides the preset.

- ``grpo`` (Shao et al., arXiv 2402.03300): group mean/std advantages, PPO clip ±0.2,
  ``seq-mean-token-mean``, β = 0.04 as in the paper.
- ``dapo`` (Yu et al., arXiv 2503.14476): clip-higher (0.2, 0.28), dual clip 10 on negative
  advantages, ``token-mean``, no KL. DAPO's other two parts are opt-in: dynamic sampling
  is ``CurriculumSampler(dynamic_filtering=True)``, overlong shaping the
  ``soft_overlong_punishment`` reward (or ``RLModule(mask_truncated_completions=True)``).
- ``dr_grpo`` (Liu et al., arXiv 2503.20783): mean-only advantages, ``seq-mean-token-sum-norm``
  (divide by the generation budget), no KL.
- ``gspo`` (Zheng et al., arXiv 2507.18071): sequence ratio clipped to [1 - 3e-4, 1 + 4e-4],
  ``seq-mean-token-mean``, no KL.
- ``cispo`` (MiniMax-M1, arXiv 2506.13585): IS weight truncated at 1 + 0.28, no lower bound,
  ``token-mean``, no KL.
- ``ctpo`` (arXiv 2605.07331): cumulative token ratio, log-space bounds 0.025·√t / 0.05·√t,
  ``token-mean``, no KL.

See docs/objectives.md for every policy loss, advantage and KL estimator. `check_pair` refuses
combinations that are not meaningful.

A bare policy-loss name (any key of `POLICY_LOSSES`, e.g. ``"ppo_clip"``) takes the ``grpo``
preset with that loss.
"""
from __future__ import annotations

from typing import Any

from .advantages import ADVANTAGE_ESTIMATORS, check_group_size
from .advantages_zoo import PASSK_DEFAULT_K, check_quantile
from .policy_losses import POLICY_LOSSES

PRESETS: dict[str, dict[str, Any]] = {
    "grpo": dict(policy_loss="ppo_clip", advantage="grpo", loss_aggregation="seq-mean-token-mean",
                 clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.04),
    "dapo": dict(policy_loss="ppo_clip", advantage="grpo", loss_aggregation="token-mean",
                 clip_low=0.2, clip_high=0.28, dual_clip=10.0, kl_coef=0.0),
    "dr_grpo": dict(policy_loss="ppo_clip", advantage="dr_grpo", loss_aggregation="seq-mean-token-sum-norm",
                    clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.0),
    "gspo": dict(policy_loss="gspo", advantage="grpo", loss_aggregation="seq-mean-token-mean",
                 clip_low=3e-4, clip_high=4e-4, dual_clip=None, kl_coef=0.0),
    "cispo": dict(policy_loss="cispo", advantage="grpo", loss_aggregation="token-mean",
                  clip_low=0.2, clip_high=0.28, dual_clip=None, kl_coef=0.0),
    # ctpo reads clip_low/clip_high as the coefficients of sqrt(t) in log space.
    "ctpo": dict(policy_loss="ctpo", advantage="grpo", loss_aggregation="token-mean",
                 clip_low=0.025, clip_high=0.05, dual_clip=None, kl_coef=0.0),
}

# Losses that weight by π_prox/π_behav themselves, and losses with no importance ratio at all.
SELF_CORRECTING = {"decoupled_ppo"}
ON_POLICY_ONLY = {"rgra", "reinforce"}


def resolve_objective(objective: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The preset for ``objective`` with every non-None override applied."""
    if objective in PRESETS:
        settings = dict(PRESETS[objective])
    elif objective in POLICY_LOSSES:
        settings = {**PRESETS["grpo"], "policy_loss": objective}
    else:
        raise ValueError(f"unknown objective {objective!r}; presets: {', '.join(PRESETS)}; "
                         f"policy losses: {', '.join(POLICY_LOSSES.names())}")
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return settings


def check_pair(policy_loss: str, advantage: str, *, group_size: int | None = None,
               advantage_kwargs: dict[str, Any] | None = None, rollout_correction: str | None = None,
               updates_per_rollout: int = 1) -> None:
    """Fail early on a policy loss / advantage estimator combination that is not meaningful.

    Every registered loss works with every estimator as tensors; what can be wrong is the pair
    together with the run's settings: a group-relative estimator with ``group_size = 1``;
    ``passk`` with k > G; ``qae`` with K outside (0, 1); ``decoupled_ppo`` (which weights by
    π_prox/π_behav itself) with the module's ``rollout_correction`` on top; a ratio-free loss
    (``rgra``/``reinforce``) reused for ``updates_per_rollout > 1``. Checks needing the data
    (``passk`` with non-binary rewards, missing behaviour log-probs) run in the functions.
    """
    POLICY_LOSSES.get(policy_loss), ADVANTAGE_ESTIMATORS.get(advantage)
    opts = dict(advantage_kwargs or {})
    if group_size is not None:
        check_group_size(advantage, group_size)
        if advantage == "reinforce_pp" and opts.get("group_baseline") and group_size < 2:
            raise ValueError("reinforce_pp with group_baseline=True subtracts a group mean, so it needs "
                             f"group_size >= 2 (got {group_size}); drop group_baseline for G = 1")
        k = opts.get("k", PASSK_DEFAULT_K)
        if advantage == "passk" and not 1 <= k <= group_size:
            raise ValueError(f"passk needs 1 <= k <= group_size (got k={k}, group_size={group_size}); "
                             "set advantage_kwargs={'k': ...} or raise group_size")
    if advantage == "qae":
        check_quantile(opts.get("quantile", 0.4))
    if policy_loss in SELF_CORRECTING and rollout_correction is not None:
        raise ValueError(f"{policy_loss!r} already weights each token by π_prox/π_behav; the module's "
                         f"rollout_correction={rollout_correction!r} would correct a second time. "
                         "Pass rollout_correction=None")
    if policy_loss in ON_POLICY_ONLY and updates_per_rollout > 1:
        raise ValueError(f"{policy_loss!r} has no importance ratio, so reusing a rollout "
                         f"(updates_per_rollout={updates_per_rollout}) trains on stale samples uncorrected; "
                         "use updates_per_rollout=1, or a ratio-based loss such as 'ppo_clip' or 'cispo'")
