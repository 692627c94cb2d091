"""BAPO: adaptive clip bounds that re-balance positive and negative advantage contributions."""
from __future__ import annotations

import math
from typing import Any

import torch

from lightning_rlpt.algorithms.losses import POLICY_LOSSES
from lightning_rlpt.algorithms.numerics import safe_ratio
from lightning_rlpt.hooks import RLCallback
from lightning_rlpt.model.distributed import reduce_over_ranks

from ._common import log_metrics, require

MEASURES = ("gradient", "clamped")


class BAPO(RLCallback):
    """Balanced Policy Optimization with adaptive clipping, driving the module's clip knobs.

    Xi et al., "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
    Optimization with Adaptive Clipping", arXiv 2510.18927 (code: WooooDyy/BAPO). Off-policy,
    negative-advantage tokens come to dominate the gradient; BAPO picks, for every optimizer
    step, ratio bounds ``[c_low, c_high]`` so that the positive contribution is at least
    ``target_ratio`` times the negative one. With ``r = π_θ/π_old`` per token, a token's
    contribution is the size ``r·|A|`` of its policy gradient when the clip leaves it one::

        pos = Σ_{A>0, r ≤ c_high} r·A         neg = Σ_{A<0, r ≥ c_low} r·|A|

    so raising ``c_high`` admits more positive tokens and raising ``c_low`` drops more
    low-ratio negative ones: both move ``pos/neg`` up. (The authors' verl recipe instead sums
    the clamped values ``min(r, c_high)·A`` and ``max(r, c_low)·|A|``, under which raising
    ``c_low`` *increases* the negative sum; ``measure="clamped"`` reproduces it.)

    Starting from ``(low_bounds[0], high_bounds[0])`` each step, ``c_low`` is raised by
    ``low_step`` until ``pos/neg ≥ target_ratio`` or it reaches ``low_bounds[1]``; then
    ``c_high`` by ``high_step`` up to ``high_bounds[1]`` (the authors' order). The sums are
    all-reduced over data-parallel ranks (``trainer.strategy.reduce``) so every rank picks the
    same bounds: the whole search path is evaluated locally and reduced in one call. The result
    sets ``module.knobs.clip_low = 1 - c_low`` and ``module.knobs.clip_high = c_high - 1`` in
    ``on_before_loss``.

    ``r`` needs the current log-probs: when the mini-batch has ``old_logprobs`` (the rollout is
    reused, or a callback asked ``module.request(old_logprobs=True)``) one extra no-grad forward computes them;
    otherwise the step is on-policy, ``r = 1``, and the bounds cannot change the balance. The
    sums run over the tokens the loss trains on (``module.loss_mask``: truncated rows left out
    under ``mask_truncated_completions``). BAPO claims the ``clip_low``/``clip_high`` knobs.
    Works with losses that read the knobs as a token ratio range (``ppo_clip``, ``minpro``).

    Args:
        target_ratio: the wanted ``pos/neg`` (authors' default 1.0).
        low_bounds: ``(start, max)`` of ``c_low``; the paper's ``[0.6, 0.9]`` (the authors'
            example config stops at 0.8).
        high_bounds: ``(start, max)`` of ``c_high``; ``[1.2, 3.0]`` (authors' example: 2.0).
        low_step / high_step: increments (0.05).
        measure: ``gradient`` (default, above) or ``clamped`` (the authors' code).
        eps: added to ``neg`` in the ratio.

    Logs ``bapo/c_low``, ``bapo/c_high``, ``bapo/pos_neg_ratio`` (at the chosen bounds).

    Examples:
        >>> from lightning_rlpt.callbacks import BAPO
        >>> bapo = BAPO(target_ratio=1.0, low_bounds=(0.6, 0.7), high_bounds=(1.2, 1.3))
        >>> [(round(lo, 2), round(hi, 2)) for lo, hi in bapo.search_path()]
        [(0.6, 1.2), (0.65, 1.2), (0.7, 1.2), (0.7, 1.25), (0.7, 1.3)]
    """

    requires = ("knobs", "objective", "policy_logprobs", "loss_mask")

    def __init__(self, target_ratio: float = 1.0, low_bounds: tuple[float, float] = (0.6, 0.9),
                 high_bounds: tuple[float, float] = (1.2, 3.0), low_step: float = 0.05, high_step: float = 0.05,
                 measure: str = "gradient", eps: float = 1e-8):
        require(measure in MEASURES, f"measure must be one of {MEASURES} (got {measure!r})")
        require(target_ratio > 0, f"target_ratio must be > 0 (got {target_ratio})")
        require(0 < low_bounds[0] <= low_bounds[1] < 1,
                f"low_bounds must satisfy 0 < start <= max < 1 (got {low_bounds}); they are ratio bounds, e.g. (0.6, 0.9)")
        require(1 < high_bounds[0] <= high_bounds[1],
                f"high_bounds must satisfy 1 < start <= max (got {high_bounds}); they are ratio bounds, e.g. (1.2, 3.0)")
        require(low_step > 0 and high_step > 0, f"steps must be > 0 (got {low_step}, {high_step})")
        self.target_ratio, self.eps, self.measure = float(target_ratio), float(eps), measure
        self.low_bounds, self.high_bounds = tuple(map(float, low_bounds)), tuple(map(float, high_bounds))
        self.low_step, self.high_step = float(low_step), float(high_step)
        self.c_low, self.c_high = self.low_bounds[0], self.high_bounds[0]
        self.pos_neg_ratio = float("nan")
        self.steps = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(target_ratio=self.target_ratio, low_bounds=self.low_bounds,
                                        high_bounds=self.high_bounds)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        loss, clipping = pl_module.objective.policy_loss, POLICY_LOSSES.names(token_clip=True)
        require(loss in clipping,  # the losses that read clip_low/clip_high as the token ratio range
                f"BAPO moves token ratio bounds, but the policy loss is {loss!r}; use one of {clipping}")
        for knob in ("clip_low", "clip_high"):
            pl_module.knobs.claim(knob, owner=self, trainer=trainer)

    # ---------------------------------------------------------------- the search
    def search_path(self) -> list[tuple[float, float]]:
        """The bounds the authors' loop visits, in order: raise ``c_low`` first, then ``c_high``."""
        def ramp(start: float, stop: float, step: float) -> list[float]:
            n = math.ceil((stop - start) / step - 1e-9)
            return [min(start + i * step, stop) for i in range(1, n + 1)]

        lo0, lo_max = self.low_bounds
        hi0, hi_max = self.high_bounds
        return ([(lo0, hi0)] + [(lo, hi0) for lo in ramp(lo0, lo_max, self.low_step)]
                + [(lo_max, hi) for hi in ramp(hi0, hi_max, self.high_step)])

    def contributions(self, ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      path: list[tuple[float, float]]) -> torch.Tensor:
        """``[len(path), 2]``: this rank's (pos, neg) sums at each candidate bound pair."""
        adv = advantages.unsqueeze(-1).expand_as(ratio) if advantages.dim() == 1 else advantages
        adv = adv.double() * mask.double()
        r = ratio.double()
        pos_w, neg_w = adv.clamp(min=0), (-adv).clamp(min=0)
        rows = []
        for lo, hi in path:
            if self.measure == "gradient":
                pos, neg = (r * pos_w * (r <= hi)).sum(), (r * neg_w * (r >= lo)).sum()
            else:
                pos, neg = (r.clamp(max=hi) * pos_w).sum(), (r.clamp(min=lo) * neg_w).sum()
            rows.append(torch.stack([pos, neg]))
        return torch.stack(rows)

    def choose(self, sums: torch.Tensor) -> tuple[int, float]:
        """First candidate meeting the target (else the last), and its ``pos/neg``."""
        ratios = [math.inf if neg <= 0 else pos / (neg + self.eps) for pos, neg in sums.tolist()]
        index = next((i for i, q in enumerate(ratios) if q >= self.target_ratio), len(ratios) - 1)
        return index, ratios[index]

    # ---------------------------------------------------------------- the hook
    @torch.no_grad()
    def current_ratio(self, module: Any, minibatch: Any) -> torch.Tensor:
        """``π_θ/π_old`` per token for the mini-batch (1 when it is on-policy)."""
        if minibatch.old_logprobs is None:
            return torch.ones_like(minibatch.completion_mask, dtype=torch.float32)
        logp, _ = module.policy_logprobs(minibatch)
        return safe_ratio(logp.float() - minibatch.old_logprobs.float())

    def on_before_loss(self, trainer: Any, module: Any, minibatch: Any) -> None:
        path = self.search_path()
        ratio = self.current_ratio(module, minibatch)
        local = self.contributions(ratio, minibatch.advantages, module.loss_mask(minibatch), path)  # trained tokens
        sums = torch.tensor(reduce_over_ranks(trainer, local.flatten().tolist()), dtype=torch.float64).view(-1, 2)
        index, self.pos_neg_ratio = self.choose(sums)
        self.c_low, self.c_high = path[index]
        module.knobs.clip_low, module.knobs.clip_high = 1.0 - self.c_low, self.c_high - 1.0
        self.steps += 1
        log_metrics(module, "bapo", {"c_low": self.c_low, "c_high": self.c_high,
                                     "pos_neg_ratio": min(self.pos_neg_ratio, 1e6)})
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"c_low": self.c_low, "c_high": self.c_high, "pos_neg_ratio": self.pos_neg_ratio, "steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.c_low, self.c_high = float(state_dict["c_low"]), float(state_dict["c_high"])
        self.pos_neg_ratio, self.steps = float(state_dict["pos_neg_ratio"]), int(state_dict["steps"])
