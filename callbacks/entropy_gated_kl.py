"""SAFE: an entropy-gated, PID-thresholded KL coefficient."""
from __future__ import annotations

import math
from typing import Any

import torch

from lightning_rlpt.hooks import RLCallback
from lightning_rlpt.model.distributed import reduce_over_ranks

from ._common import global_token_mean, log_metrics, require, require_reference

PHASES = ("warmup", "climbing", "converged", "plateau")


class EntropyGatedKL(RLCallback):
    """Raise the KL coefficient when the smoothed KL exceeds an adaptive threshold, more so
    when entropy is low (SAFE: "Stable Alignment Finetuning with Entropy-aware predictive
    control", code: github.com/ryyzn9/SAFE; formulas in docs/callbacks.md, "EntropyGatedKL").

    Per rollout (``on_advantages_computed``), with ``kl`` the token mean of ``logπ − logπ_ref``,
    ``H`` the mean token entropy of the policy on the rollout (both over the tokens the loss
    trains on, ``module.loss_mask``, on all ranks) and ``mean_reward`` the mean raw (undithered)
    score:

    - ``kl_s ← s·kl_s + (1−s)·kl`` (``s = kl_smoothing``; the first rollout sets ``kl_s = kl``);
    - reward EMA ``e ← r·e + (1−r)·mean_reward`` (first rollout: ``e = mean_reward``),
      ``err = (e_t − e_{t−1}) − target_velocity``, integral ``I`` clamped to
      ``±integral_limit``, ``u = kp·err + ki·I + kd·(err − err_prev)``;
    - phase multiplier ``m``: ``warmup`` for the first ``warmup_steps`` rollouts; then
      ``climbing`` when the mean of the last ``window`` mean rewards beats the previous
      ``window`` by ``climb_margin``; ``converged`` when their (population) std is below
      ``converged_std`` and their mean above ``converged_reward``; else ``plateau``;
    - threshold ``τ = clip((base_threshold + u)·m, *threshold_range)``.

    **How it acts on the loss.** SAFE adds ``λ·(kl − τ)²·g(H)`` with
    ``g(H) = max(min_entropy_factor, entropy_floor/(H + entropy_eps))`` but computes it from a
    Python float, so it has no gradient. Here the callback **sets ``module.knobs.kl_coef``** for
    every optimizer step of the rollout (``on_before_loss``) to

        ``β = base_kl_coef + 2λ·(kl_s − τ)·g(H)`` when ``kl_s > τ``, else ``base_kl_coef``,

    the derivative of SAFE's penalty with respect to the KL at ``kl_s``: the module's
    differentiable KL term ``β·KL`` then has the gradient SAFE's penalty was meant to have.

    The policy's log-probs and entropy on the rollout cost one extra no-grad forward pass. The
    callback claims the ``kl_coef`` knob (a second callback moving it is refused at setup).

    Args:
        base_kl_coef: β when the gate is closed (None: the module's ``kl_coef`` at fit start).
        penalty_scale: λ (SAFE 0.1).
        entropy_floor / min_entropy_factor / entropy_eps: the entropy gate g(H) (2.0, 0.5, 0.1).
        kl_smoothing: s (0.9).
        reward_smoothing: r (0.95).
        target_velocity: reward-EMA velocity the PID aims at (0.001).
        kp / ki / kd: PID gains (0.3, 0.01, 0.05); ``integral_limit`` clamps I (1.0).
        base_threshold: τ before the PID and phase (0.3); ``threshold_range``: clip (0.1, 0.6).
        warmup_steps / window: rollouts of warm-up and of each phase window (50, 50).
        climb_margin / converged_std / converged_reward: phase tests (0.01, 0.02, 0.7).
        phase_multipliers: ``{"warmup": 1.5, "climbing": 1.2, "converged": 1.0, "plateau": 0.8}``.

    Logs ``safe/{kl, kl_smoothed, entropy, reward_ema, pid_p, pid_i, pid_d, pid_u, phase,
    phase_multiplier, threshold, gate, kl_coef}`` (``phase``: index into warmup, climbing,
    converged, plateau).

    Examples:
        >>> from lightning_rlpt.callbacks import EntropyGatedKL
        >>> safe = EntropyGatedKL(penalty_scale=0.1, warmup_steps=10)
        >>> round(safe.observe(mean_reward=0.5, kl=0.8, entropy=1.0)["threshold"], 4)
        0.4495
    """

    requires = ("knobs", "use_reference", "policy_logprobs", "loss_mask")

    def __init__(self, base_kl_coef: float | None = None, penalty_scale: float = 0.1, entropy_floor: float = 2.0,
                 min_entropy_factor: float = 0.5, entropy_eps: float = 0.1, kl_smoothing: float = 0.9,
                 reward_smoothing: float = 0.95, target_velocity: float = 0.001, kp: float = 0.3, ki: float = 0.01,
                 kd: float = 0.05, integral_limit: float = 1.0, base_threshold: float = 0.3,
                 threshold_range: tuple[float, float] = (0.1, 0.6), warmup_steps: int = 50, window: int = 50,
                 climb_margin: float = 0.01, converged_std: float = 0.02, converged_reward: float = 0.7,
                 phase_multipliers: dict[str, float] | None = None):
        require(base_kl_coef is None or base_kl_coef >= 0, f"base_kl_coef must be >= 0 or None (got {base_kl_coef})")
        require(penalty_scale >= 0, f"penalty_scale must be >= 0 (got {penalty_scale})")
        require(entropy_floor >= 0 and min_entropy_factor >= 0 and entropy_eps > 0,
                "entropy gate needs entropy_floor >= 0, min_entropy_factor >= 0 and entropy_eps > 0 "
                f"(got {entropy_floor}, {min_entropy_factor}, {entropy_eps})")
        for name, value in (("kl_smoothing", kl_smoothing), ("reward_smoothing", reward_smoothing)):
            require(0 <= value < 1, f"{name} must be in [0, 1) (got {value})")
        require(integral_limit >= 0, f"integral_limit must be >= 0 (got {integral_limit})")
        low, high = threshold_range
        require(0 <= low <= high, f"threshold_range must satisfy 0 <= low <= high (got {threshold_range}: inverted?)")
        require(warmup_steps >= 0 and window >= 1, f"need warmup_steps >= 0 and window >= 1 (got {warmup_steps}, {window})")
        multipliers = {"warmup": 1.5, "climbing": 1.2, "converged": 1.0, "plateau": 0.8, **(phase_multipliers or {})}
        require(set(multipliers) == set(PHASES) and all(v >= 0 for v in multipliers.values()),
                f"phase_multipliers needs non-negative values for exactly {PHASES} (got {multipliers})")
        self.base_kl_coef, self.penalty_scale = base_kl_coef, penalty_scale
        self.entropy_floor, self.min_entropy_factor, self.entropy_eps = entropy_floor, min_entropy_factor, entropy_eps
        self.kl_smoothing, self.reward_smoothing, self.target_velocity = kl_smoothing, reward_smoothing, target_velocity
        self.kp, self.ki, self.kd, self.integral_limit = kp, ki, kd, integral_limit
        self.base_threshold, self.threshold_range = base_threshold, (low, high)
        self.warmup_steps, self.window = warmup_steps, window
        self.climb_margin, self.converged_std, self.converged_reward = climb_margin, converged_std, converged_reward
        self.phase_multipliers = multipliers
        self._reset_state()

    def _reset_state(self) -> None:
        self.kl_smoothed: float | None = None
        self.reward_ema: float | None = None
        self.integral = 0.0
        self.prev_err = 0.0
        self.rewards: list[float] = []  # the last 2·window mean rewards (the phase windows)
        self.rollouts = 0  # rollouts observed: ends the warm-up (the window list is truncated)
        self.kl_coef: float | None = None

    # ------------------------------------------------------------------ the controller
    def observe(self, mean_reward: float, kl: float, entropy: float) -> dict[str, float]:
        """Advance the controller by one rollout; returns its signals (``kl_coef`` among them)."""
        s = self.kl_smoothing
        self.kl_smoothed = kl if self.kl_smoothed is None else s * self.kl_smoothed + (1 - s) * kl
        pid = self._pid(mean_reward)
        phase = self._phase(mean_reward)
        m = self.phase_multipliers[phase]
        low, high = self.threshold_range
        tau = min(max((self.base_threshold + pid["pid_u"]) * m, low), high)
        gate = max(self.min_entropy_factor, self.entropy_floor / (entropy + self.entropy_eps))
        base = self.base_kl_coef if self.base_kl_coef is not None else 0.0
        excess = self.kl_smoothed - tau
        self.kl_coef = base + (2 * self.penalty_scale * excess * gate if excess > 0 else 0.0)
        return {"kl": kl, "kl_smoothed": self.kl_smoothed, "entropy": entropy, "reward_ema": self.reward_ema, **pid,
                "phase": float(PHASES.index(phase)), "phase_multiplier": m, "threshold": tau, "gate": gate,
                "kl_coef": self.kl_coef}

    def _pid(self, mean_reward: float) -> dict[str, float]:
        prev = mean_reward if self.reward_ema is None else self.reward_ema
        r = self.reward_smoothing
        self.reward_ema = mean_reward if self.reward_ema is None else r * self.reward_ema + (1 - r) * mean_reward
        err = (self.reward_ema - prev) - self.target_velocity
        self.integral = min(max(self.integral + err, -self.integral_limit), self.integral_limit)
        p, i, d = self.kp * err, self.ki * self.integral, self.kd * (err - self.prev_err)
        self.prev_err = err
        return {"pid_p": p, "pid_i": i, "pid_d": d, "pid_u": p + i + d}

    def _phase(self, mean_reward: float) -> str:
        step = self.rollouts
        self.rollouts += 1
        self.rewards = (self.rewards + [mean_reward])[-2 * self.window:]
        if step < self.warmup_steps:
            return "warmup"
        last, prev = self.rewards[-self.window:], self.rewards[:-self.window]
        mean_last = sum(last) / len(last)
        if prev and mean_last > sum(prev) / len(prev) + self.climb_margin:
            return "climbing"
        std = math.sqrt(sum((x - mean_last) ** 2 for x in last) / len(last))
        if std < self.converged_std and mean_last > self.converged_reward:
            return "converged"
        return "plateau"

    # ------------------------------------------------------------------ Lightning / RL hooks
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        require_reference(pl_module, "EntropyGatedKL")
        pl_module.knobs.claim("kl_coef", owner=self, trainer=trainer)
        if self.base_kl_coef is None:
            self.base_kl_coef = float(pl_module.knobs.kl_coef)

    def on_advantages_computed(self, trainer, module, experience):
        with torch.no_grad():
            logp, entropy = module.policy_logprobs(experience, with_entropy=True)
        kl, ent = global_token_mean(trainer, module.loss_mask(experience), logp - experience.ref_logprobs, entropy)
        reward = reduce_over_ranks(trainer, [experience.scores.float().mean().item()], "mean")[0]
        signals = self.observe(reward, kl, ent)
        log_metrics(module, "safe", signals)

    def on_before_loss(self, trainer, module, minibatch):
        if self.kl_coef is not None:
            module.knobs.kl_coef = self.kl_coef

    def state_dict(self) -> dict[str, Any]:
        return {"base_kl_coef": self.base_kl_coef, "kl_smoothed": self.kl_smoothed, "reward_ema": self.reward_ema,
                "integral": self.integral, "prev_err": self.prev_err, "rewards": list(self.rewards),
                "rollouts": self.rollouts, "kl_coef": self.kl_coef}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key, value in state_dict.items():
            setattr(self, key, list(value) if key == "rewards" else value)

