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
- ``luspo`` (arXiv 2602.05261): GSPO's sequence ratio and ranges, each sequence's loss times its
  length, ``seq-mean-token-mean``, no KL.
- ``vespo`` (arXiv 2602.10693): Gamma-kernel weight of the sequence IS ratio, ``token-mean`` (as
  TRL and the authors' verl runs), no KL.

See docs/objectives.md for every policy loss, advantage and KL estimator. `check_objective`
refuses combinations that are not meaningful.

A bare policy-loss name (any key of `POLICY_LOSSES`, e.g. ``"ppo_clip"``) takes the ``grpo``
preset with that loss.

``grpo`` is `RLModule`'s default objective and differs from TRL's ``GRPOTrainer`` defaults in
two places, on purpose: β = 0.04 (TRL 0.0) and ``seq-mean-token-mean`` (TRL's default
``loss_type="dapo"`` is ``token-mean``). A preset reproduces the paper it is named after, which
is what ``objective="grpo"`` asks for; TRL's defaults are ``kl_coef=0.0,
loss_aggregation="token-mean"`` on it (the ``dapo`` preset adds DAPO's clip-higher and dual
clip). The reasons: docs/objectives.md, "Defaults, and where they differ from TRL".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .advantages import ADVANTAGE_ESTIMATORS, check_estimator
from .aggregation import check_aggregation
from .losses import POLICY_LOSSES
from .losses.base import MODULE_OPTIONS

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
    "luspo": dict(policy_loss="luspo", advantage="grpo", loss_aggregation="seq-mean-token-mean",
                  clip_low=3e-4, clip_high=4e-4, dual_clip=None, kl_coef=0.0),
    # vespo has no clip: its kernel replaces it, so the clip ranges are unused.
    "vespo": dict(policy_loss="vespo", advantage="grpo", loss_aggregation="token-mean",
                  clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.0),
}



@dataclass(frozen=True)
class Objective:
    """What a run optimises: the selected functions and the preset's starting values.

    ``kl_coef``, ``clip_low`` and ``clip_high`` are the *initial* values of the module's
    `Knobs` (which callbacks may move); the rest is fixed for the run.
    """

    policy_loss: str
    advantage: str
    loss_aggregation: str
    clip_low: float
    clip_high: float
    dual_clip: float | None
    kl_coef: float

    def __post_init__(self) -> None:
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0 (got {self.kl_coef})")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError("clip ranges must satisfy 0 <= clip_low < 1 and clip_high >= 0 "
                             f"(got {self.clip_low}, {self.clip_high})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def self_correcting(self) -> bool:
        return POLICY_LOSSES.trait(self.policy_loss, "self_correcting")


def resolve_objective(objective: str, overrides: dict[str, Any]) -> Objective:
    """The preset for ``objective`` with every non-None override applied (names checked)."""
    if objective in PRESETS:
        settings = dict(PRESETS[objective])
    elif objective in POLICY_LOSSES:
        settings = {**PRESETS["grpo"], "policy_loss": objective}
    else:
        raise ValueError(f"unknown objective {objective!r}; presets: {', '.join(PRESETS)}; "
                         f"policy losses: {', '.join(POLICY_LOSSES.names())}")
    selected = replace(Objective(**settings), **{k: v for k, v in overrides.items() if v is not None})
    POLICY_LOSSES.get(selected.policy_loss), ADVANTAGE_ESTIMATORS.get(selected.advantage)
    check_aggregation(selected.loss_aggregation)
    return selected


def check_objective(objective: Objective, *, group_size: int, advantage_kwargs: dict[str, Any] | None = None,
                    rollout_correction: str | None = None, updates_per_rollout: int = 1,
                    policy_loss_kwargs: dict[str, Any] | None = None) -> None:
    """Fail early on a selection that cannot be meaningful with the run's settings.

    Option dictionaries are checked against the selected functions' signatures: a key the
    function does not take (``{"basline": .1}``) is refused, naming the function, its options
    and the closest one; so is a policy-loss key the module passes itself (`MODULE_OPTIONS`).
    The estimator checks its own needs (its ``group_relative`` and ``check`` traits: group size,
    passk's k, qae's quantile); what is left are pairs: a ``self_correcting`` loss
    (``decoupled_ppo``, which weights by π_prox/π_behav itself) with the module's
    ``rollout_correction`` on top; a loss made for one ``aggregation`` (``luspo``) with another;
    an ``on_policy_only`` loss (``rgra``/``reinforce``) reused for ``updates_per_rollout > 1``. Checks needing the data (``passk`` with non-binary rewards,
    missing behaviour log-probs) run in the functions.
    """
    check_estimator(objective.advantage, group_size, advantage_kwargs)
    loss = objective.policy_loss
    POLICY_LOSSES.check_options(loss, policy_loss_kwargs, "policy_loss_kwargs", supplied=MODULE_OPTIONS)
    if objective.self_correcting and rollout_correction is not None:
        raise ValueError(f"{loss!r} already weights each token by π_prox/π_behav; the module's "
                         f"rollout_correction={rollout_correction!r} would correct a second time. "
                         "Pass rollout_correction=None")
    made_for = POLICY_LOSSES.trait(loss, "aggregation")
    if made_for is not None and objective.loss_aggregation != made_for:
        raise ValueError(f"{loss!r} is made for loss_aggregation={made_for!r}, not {objective.loss_aggregation!r} "
                         f"(its per-token loss already carries the normalisation); pass loss_aggregation={made_for!r} "
                         f"or take objective={loss!r}")
    if POLICY_LOSSES.trait(loss, "on_policy_only") and updates_per_rollout > 1:
        raise ValueError(f"{loss!r} has no importance ratio, so reusing a rollout "
                         f"(updates_per_rollout={updates_per_rollout}) trains on stale samples uncorrected; "
                         "use updates_per_rollout=1, or a ratio-based loss such as 'ppo_clip' or 'cispo'")
