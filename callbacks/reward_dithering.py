"""ReDit: zero-mean noise on discrete rewards before group normalisation."""
from __future__ import annotations

import math
from typing import Any

import torch

from lightning_rlpt.hooks import RLCallback
from lightning_rlpt.seeding import keyed_generator

from ._common import log_metrics, require

DISTRIBUTIONS = ("gaussian", "uniform")
DECAYS = (None, "linear", "cosine", "exponential")


class RewardDithering(RLCallback):
    """Add zero-mean noise to each reward before advantages are computed (ReDit: "ReDit:
    Reward Dithering for Improved LLM Policy Optimization", arXiv 2506.18631; docs/callbacks.md).

    Discrete rewards (0/1) give many groups identical rewards, hence zero advantage and no
    gradient; small noise breaks the ties while leaving the expected reward unchanged. The
    noise is added to ``experience.rewards`` in ``on_rewards_computed``, i.e. before group
    normalisation; ``rewards_per_func`` (the raw scores) are left alone, so accuracy and
    pass-rate statistics of other callbacks are not perturbed.

    The noise is drawn once per training batch, on the assembled batch (after any dynamic
    filtering and refill, whatever the callback order), from a generator keyed by
    ``(seed, rollout, rank)``: each data-parallel rank draws its own noise, and a resumed run,
    which restores only the rollout counter, draws exactly the noise an uninterrupted one would.

    Args:
        scale: σ of ``N(0, σ²)`` for ``gaussian``, half-width ``a`` of ``U(−a, a)`` for
            ``uniform``; must be > 0. ReDit reports small scales (≈0.05) best; the exact default
            is open, 0.05 chosen.
        distribution: ``gaussian`` or ``uniform``.
        decay: None (constant), ``linear``, ``cosine`` (both reach ``final_scale`` after
            ``decay_steps`` rollouts and stay there) or ``exponential``
            (``scale·(final_scale/scale)^(t/decay_steps)``, floored at ``final_scale``).
        decay_steps: training batches (rollouts, refills not counted) over which the scale
            anneals (needed with ``decay``).
        final_scale: the scale at the end of the decay (default 0), ``0 <= final_scale <= scale``
            (> 0 for ``exponential``).
        seed: seeds the noise streams.

    Logs ``redit/scale``, ``redit/noise_mean`` and ``redit/noise_std`` (of this rollout's draw).

    Examples:
        >>> from lightning_rlpt.callbacks import RewardDithering
        >>> dither = RewardDithering(scale=0.05, distribution="uniform", decay="linear", decay_steps=100)
        >>> dither.scale_at(50)
        0.025
    """

    def __init__(self, scale: float = 0.05, distribution: str = "gaussian", decay: str | None = None,
                 decay_steps: int | None = None, final_scale: float = 0.0, seed: int = 0):
        require(distribution in DISTRIBUTIONS, f"distribution must be one of {DISTRIBUTIONS} (got {distribution!r})")
        require(scale > 0, f"noise scale must be > 0 (got {scale}); remove the callback for no noise")
        require(decay in DECAYS, f"decay must be one of {DECAYS} (got {decay!r})")
        if decay is not None:
            require(decay_steps is not None and decay_steps >= 1, f"decay={decay!r} needs decay_steps >= 1 (got {decay_steps})")
            require(0 <= final_scale <= scale, f"final_scale must be in [0, scale={scale}] (got {final_scale})")
            require(decay != "exponential" or final_scale > 0, "decay='exponential' needs final_scale > 0")
        self.scale, self.distribution, self.decay = scale, distribution, decay
        self.decay_steps, self.final_scale, self.seed = decay_steps, final_scale, seed
        self.rollouts = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(scale=self.scale, distribution=self.distribution, seed=self.seed)

    def scale_at(self, t: int) -> float:
        """The noise scale for the ``t``-th rollout (0-based)."""
        if self.decay is None:
            return self.scale
        frac = min(t / self.decay_steps, 1.0)
        lo, hi = self.final_scale, self.scale
        if self.decay == "linear":
            return hi + (lo - hi) * frac
        if self.decay == "cosine":
            return lo + (hi - lo) * 0.5 * (1 + math.cos(math.pi * frac))
        return hi * (lo / hi) ** frac

    def noise(self, n: int, scale: float, rollout: int = 0, rank: int = 0) -> torch.Tensor:
        """``n`` draws at ``scale`` for this rollout and rank (float32, CPU)."""
        g = keyed_generator("dithering", self.seed, rollout, rank)
        if self.distribution == "gaussian":
            return torch.randn(n, generator=g) * scale
        return (torch.rand(n, generator=g) * 2 - 1) * scale

    def on_rewards_computed(self, trainer, module, experience):
        scale = self.scale_at(self.rollouts)
        noise = self.noise(len(experience), scale, self.rollouts, getattr(trainer, "global_rank", 0))
        self.rollouts += 1
        experience.rewards = experience.rewards + noise.to(experience.rewards.device, experience.rewards.dtype)
        log_metrics(module, "redit", {"scale": scale, "noise_mean": noise.mean().item() if len(noise) else 0.0,
                                      "noise_std": noise.std().item() if len(noise) > 1 else 0.0})

    def state_dict(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rollouts = int(state_dict["rollouts"])
