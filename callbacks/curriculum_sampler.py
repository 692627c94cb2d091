"""Pass-rate curricula (FG-ExPO, Paced, SC-SDPO, LSPO) and DAPO's dynamic filtering."""
from __future__ import annotations

import math
from typing import Any

import torch

from lightning_rlpt.data.samplers import WeightedEpochSampler
from lightning_rlpt.hooks import RLCallback
from lightning_rlpt.seeding import keyed_generator

from ._common import log_metrics, require

WEIGHTINGS = ("gaussian", "beta", "sqrt_variance", "length", None)
USES = ("sampling", "loss")


def quantile_inf(values: torch.Tensor, q: float) -> float:
    """``Q(q) = inf{t : F(t) >= q}`` of the empirical distribution (LSPO's definition)."""
    ordered = values.sort().values
    return float(ordered[max(math.ceil(q * len(ordered)) - 1, 0)])


class CurriculumSampler(RLCallback):
    """Track each prompt's pass rate and turn it into sampling (or loss) weights; optionally
    drop zero-variance groups and refill the batch (DAPO dynamic sampling).

    Statistics, per dataset row (the batch's ``index`` column): the pass rate ``p`` (fraction of
    the G completions whose raw weighted score — before dithering — reaches the module's
    ``success_threshold``) and the mean response length ``L``; the first observation sets them,
    later ones update an EMA ``x ← (1 − ema)·x + ema·obs``. Gathered across ranks, checkpointed.

    Weightings (``w`` floored at ``min_weight``; unseen prompts use ``p = prior`` and ``w = 1``
    for ``length``):

    - ``gaussian`` — FG-ExPO's Gaussian curriculum (arXiv 2605.11403):
      ``exp(−(p − mu)²/(2·sigma²))``, mu 0.5; sigma (open) 0.25.
    - ``beta`` — Paced (arXiv 2603.11178): ``p^alpha·(1 − p)^beta``, alpha = beta = 1 (v3).
    - ``sqrt_variance`` — SC-SDPO (arXiv 2605.27765): ``[p(1 − p)]^½``.
    - ``length`` — LSPO ("Length-aware Dynamic Sampling for Policy Optimization", Chen, Koenig,
      Dilkina, arXiv 2510.01459). Reading of the paper: LSPO keeps prompts whose average
      response length ``L(q)`` is at most the ``q_low`` quantile or at least the ``q_high``
      quantile (``Q(α) = inf{t : F(t) ≥ α}``, recomputed per batch) and at most ``L_max``,
      after DAPO's zero-variance filter. Here that is a 0/1 weight (1 = kept), with the
      quantiles over the prompts being weighted; quantiles (open) 0.3/0.7.

    ``use_as="sampling"`` installs a `WeightedEpochSampler` on the `PromptDataModule`: each
    (sampler) epoch draws ``epoch_size`` prompts from the weights of the epoch start, *with
    replacement* by default, so a prompt is trained on in proportion to its weight (the papers
    sample prompts by weight; a draw without replacement of every prompt would be a mere
    reordering). Smaller ``epoch_size`` refreshes the curriculum more often. ``use_as="loss"``
    keeps the data order and writes the weights, divided by their batch mean (SC-SDPO's
    batch-adaptive normaliser, used for all weightings), into ``experience.sample_weights``.

    ``dynamic_filtering`` (DAPO, Yu et al., arXiv 2503.14476): in ``on_rollout_scored``
    groups whose raw scores are all equal are dropped, and prompts drawn from the current
    weights (uniformly with ``use_as="loss"`` or no weighting) are rolled out to refill the
    batch, for at most ``max_refill_rounds`` rounds (then the batch trains smaller; with no
    informative group at all it trains on the batch as sampled, whose advantages are zero, so
    every rollout still makes its optimizer step and step counts stay aligned with batches).
    Refill prompts go through every RL callback's ``on_rollout_end``; the assembled batch then
    goes through ``on_rewards_computed`` once, so dithering and KL controllers see it whole,
    whichever side of this callback they are listed on. Under data parallelism each round draws
    ``ranks × need`` distinct prompts from one stream shared by the ranks and gives each rank its
    own slice (no group is rolled out twice), with a per-rank rollout seed; both streams derive
    from ``seed``, the rollout count and the round, so a resumed run refills exactly as before.

    Args:
        weighting: one of ``gaussian``, ``beta``, ``sqrt_variance``, ``length`` or None
            (statistics and filtering only).
        use_as: ``sampling`` or ``loss``.
        mu / sigma: the Gaussian's centre in [0, 1] and width (> 0).
        alpha / beta: Paced exponents (>= 0).
        length_quantiles: ``(q_low, q_high)``, ``0 <= q_low <= q_high <= 1``.
        length_max: drop (weight ``min_weight``) prompts with ``L > length_max`` (None: no cap).
        ema: update rate of the statistics in (0, 1] (0.5).
        prior: pass rate assumed for unseen prompts (0.5).
        min_weight: floor of every weight (0.01, > 0 so every prompt can still be drawn).
        epoch_size: prompts per sampler epoch (None: the dataset size).
        replacement: the sampler draws with replacement (True, default) or without.
        dynamic_filtering / max_refill_rounds: see above (False, 3).
        seed: seeds the refill draws and refill rollouts.

    Logs ``curriculum/pass_rate`` (of the batch as sampled), ``curriculum/seen`` (fraction of
    prompts observed so far), ``curriculum/weight_mean`` (loss mode) and, with filtering,
    ``curriculum/{zero_variance_groups, refill_rounds, kept_groups}``.

    Examples:
        >>> import torch
        >>> from lightning_rlpt.callbacks import CurriculumSampler
        >>> cs = CurriculumSampler(weighting="beta", alpha=1.0, beta=1.0, min_weight=0.0, use_as="loss")
        >>> cs.weights_for(torch.tensor([0.0, 0.5, 1.0]), torch.tensor([3.0, 3.0, 3.0])).tolist()
        [0.0, 0.25, 0.0]
    """

    requires = ("group_size", "success_threshold", "refill", "tokenizer")

    def __init__(self, weighting: str | None = "gaussian", use_as: str = "sampling", mu: float = 0.5,
                 sigma: float = 0.25, alpha: float = 1.0, beta: float = 1.0,
                 length_quantiles: tuple[float, float] = (0.3, 0.7), length_max: float | None = None,
                 ema: float = 0.5, prior: float = 0.5, min_weight: float = 0.01, epoch_size: int | None = None,
                 replacement: bool = True, dynamic_filtering: bool = False, max_refill_rounds: int = 3,
                 seed: int = 0):
        require(weighting in WEIGHTINGS, f"weighting must be one of {WEIGHTINGS} (got {weighting!r})")
        require(use_as in USES, f"use_as must be one of {USES} (got {use_as!r})")
        require(0 <= mu <= 1, f"mu is a pass rate and must be in [0, 1] (got {mu})")
        require(sigma > 0, f"sigma must be > 0 (got {sigma})")
        require(alpha >= 0 and beta >= 0, f"alpha and beta must be >= 0 (got {alpha}, {beta})")
        q_low, q_high = length_quantiles
        require(0 <= q_low <= q_high <= 1, f"length_quantiles must satisfy 0 <= low <= high <= 1 (got {length_quantiles}: inverted?)")
        require(length_max is None or length_max > 0, f"length_max must be > 0 or None (got {length_max})")
        require(0 < ema <= 1, f"ema must be in (0, 1] (got {ema})")
        require(0 <= prior <= 1, f"prior must be in [0, 1] (got {prior})")
        require(0 <= min_weight, f"min_weight must be >= 0 (got {min_weight})")
        require(use_as != "sampling" or weighting is None or min_weight > 0,
                "use_as='sampling' needs min_weight > 0, or prompts with weight 0 could never be drawn again")
        require(max_refill_rounds >= 0, f"max_refill_rounds must be >= 0 (got {max_refill_rounds})")
        self.weighting, self.use_as, self.mu, self.sigma, self.alpha, self.beta = weighting, use_as, mu, sigma, alpha, beta
        self.length_quantiles, self.length_max = (q_low, q_high), length_max
        self.ema, self.prior, self.min_weight, self.epoch_size = ema, prior, min_weight, epoch_size
        self.replacement = replacement
        self.dynamic_filtering, self.max_refill_rounds, self.seed = dynamic_filtering, max_refill_rounds, seed
        self.stats: dict[int, tuple[float, float]] = {}  # dataset index -> (pass rate, mean length)
        self.rollouts = 0  # batches observed: keys the refill streams
        self.sampler: WeightedEpochSampler | None = None
        self._sampler_state: dict[str, Any] | None = None
        self._dataset: Any = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(weighting=self.weighting, use_as=self.use_as)

    # ------------------------------------------------------------------ the weights
    def weights_for(self, pass_rates: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Weights of prompts with these pass rates and mean lengths (NaN: unseen)."""
        seen = ~torch.isnan(pass_rates)
        p = torch.where(seen, pass_rates, torch.full_like(pass_rates, self.prior)).double()
        if self.weighting is None:
            w = torch.ones_like(p)
        elif self.weighting == "gaussian":
            w = torch.exp(-(p - self.mu) ** 2 / (2 * self.sigma ** 2))
        elif self.weighting == "beta":
            w = p ** self.alpha * (1 - p) ** self.beta
        elif self.weighting == "sqrt_variance":
            w = (p * (1 - p)).sqrt()
        else:
            w = self._length_weights(lengths.double(), seen)
        return w.clamp(min=self.min_weight)

    def _length_weights(self, lengths: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        w = torch.ones_like(lengths)
        if seen.any():
            known = lengths[seen]
            lo, hi = (quantile_inf(known, q) for q in self.length_quantiles)
            keep = (known <= lo) | (known >= hi)
            if self.length_max is not None:
                keep &= known <= self.length_max
            w[seen] = keep.double()
        return w

    def _lookup(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        nan = (math.nan, math.nan)
        values = torch.tensor([self.stats.get(int(i), nan) for i in indices], dtype=torch.float64).view(-1, 2)
        return values[:, 0], values[:, 1]

    def sampling_weights(self) -> torch.Tensor:
        """``[dataset size]`` weights of every training prompt (what the sampler draws from)."""
        return self.weights_for(*self._lookup(list(range(len(self._dataset)))))

    # ------------------------------------------------------------------ statistics
    def observe(self, indices: list[int], pass_rates: list[float], lengths: list[float]) -> None:
        """Fold one observation per prompt into the EMAs (the first one sets them)."""
        for i, p, n in zip(indices, pass_rates, lengths):
            old = self.stats.get(int(i))
            self.stats[int(i)] = (p, n) if old is None else (
                (1 - self.ema) * old[0] + self.ema * p, (1 - self.ema) * old[1] + self.ema * n)

    def _observe_experience(self, trainer: Any, module: Any, exp: Any) -> torch.Tensor:
        g = exp.group_size
        if "index" not in exp.columns:
            raise ValueError("CurriculumSampler needs the dataset row of each prompt (an 'index' column, which "
                             "PromptDataModule adds): use PromptDataModule or add 'index' to your batches")
        scores = exp.scores.view(-1, g)
        passed = (scores >= module.success_threshold).double().mean(1)
        lengths = exp.completion_mask.sum(1).double().view(-1, g).mean(1)
        index = torch.tensor(exp.columns["index"][::g], dtype=torch.float64)
        table = torch.stack([index, passed.cpu(), lengths.cpu()], 1)
        if getattr(trainer, "world_size", 1) > 1:  # every rank keeps the same statistics
            table = trainer.strategy.all_gather(table.to(trainer.strategy.root_device)).reshape(-1, 3).cpu()
        self.observe(table[:, 0].long().tolist(), table[:, 1].tolist(), table[:, 2].tolist())
        return scores

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        dm = getattr(trainer, "datamodule", None)
        self._dataset = getattr(dm, "train_set", None)
        needs_data = self.use_as == "sampling" or self.dynamic_filtering
        if needs_data and (self._dataset is None or not hasattr(dm, "train_sampler")):
            raise ValueError("CurriculumSampler with use_as='sampling' or dynamic_filtering draws prompts from the "
                             "training set: fit with datamodule=PromptDataModule(...), or use use_as='loss' without "
                             "dynamic_filtering")
        if self.use_as == "sampling" and self.sampler is None:
            self.sampler = WeightedEpochSampler(len(self._dataset), self.sampling_weights, dm.seed, dm.batch_size,
                                                self.epoch_size, self.replacement)
            dm.train_sampler = self.sampler
        if self.sampler is not None and self._sampler_state is not None:
            self.sampler.load_state_dict(self._sampler_state)

    def on_rollout_scored(self, trainer, module, experience):
        scores = self._observe_experience(trainer, module, experience)
        metrics = {"pass_rate": (scores >= module.success_threshold).float().mean().item()}
        if self._dataset is not None:
            metrics["seen"] = len(self.stats) / len(self._dataset)
        if self.dynamic_filtering:
            experience, extra = self._filter_and_refill(trainer, module, experience, scores)
            metrics.update(extra)
        self.rollouts += 1
        log_metrics(module, "curriculum", metrics)
        return experience

    def on_advantages_computed(self, trainer, module, experience):
        if self.use_as != "loss" or self.weighting is None:
            return
        g = experience.group_size
        w = self.weights_for(*self._lookup(experience.columns["index"][::g]))
        w = (w / w.mean().clamp(min=1e-12)).float().repeat_interleave(g).to(experience.rewards.device)
        experience.sample_weights = w if experience.sample_weights is None else experience.sample_weights * w
        log_metrics(module, "curriculum", {"weight_mean": w.mean().item()})

    # ------------------------------------------------------------------ dynamic filtering
    @staticmethod
    def _informative(scores: torch.Tensor) -> list[int]:
        return [i for i, row in enumerate(scores) if (row.max() - row.min()).item() > 1e-8]

    def _filter_and_refill(self, trainer, module, exp, scores):
        target = exp.num_groups
        zero = target - len(self._informative(scores))
        kept = exp.select_groups(self._informative(scores))
        rounds = 0
        rank, world = getattr(trainer, "global_rank", 0), max(1, getattr(trainer, "world_size", 1))
        while rounds < self.max_refill_rounds and self._global_max(trainer, target - kept.num_groups) > 0:
            rounds += 1
            need = self._global_max(trainer, target - kept.num_groups)
            drawn = self._draw(need * world, keyed_generator("curriculum", self.seed, self.rollouts, rounds))
            rows = [self._dataset[i] for i in drawn[rank * need:(rank + 1) * need]]
            seed = int(torch.randint(0, 2**62, (1,), generator=keyed_generator("curriculum", self.seed, self.rollouts, rounds, rank)))
            more = module.refill(rows, seed)
            more_scores = self._observe_experience(trainer, module, more)
            good = self._informative(more_scores)[: max(target - kept.num_groups, 0)]
            if good:
                kept = kept.concat(more.select_groups(good), module.tokenizer.pad_token_id)
        metrics = {"zero_variance_groups": float(zero), "refill_rounds": float(rounds), "kept_groups": float(kept.num_groups)}
        if kept.num_groups == 0:  # nothing informative: train on the batch as sampled rather than skip the step
            kept = exp
        return kept, metrics

    def _draw(self, k: int, generator: torch.Generator) -> list[int]:
        """``k`` prompts from the current weights: distinct while the dataset allows."""
        n = len(self._dataset)
        w = self.sampling_weights() if self.use_as == "sampling" else torch.ones(n, dtype=torch.float64)
        return torch.multinomial(w, k, replacement=k > int((w > 0).sum()), generator=generator).tolist()

    @staticmethod
    def _global_max(trainer: Any, value: int) -> int:
        if getattr(trainer, "world_size", 1) <= 1:
            return value
        t = trainer.strategy.all_gather(torch.tensor([value], device=trainer.strategy.root_device))
        return int(t.max().item())

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"stats": dict(self.stats), "rollouts": self.rollouts,
                "sampler": self.sampler.state_dict() if self.sampler is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stats = {int(k): tuple(v) for k, v in state_dict["stats"].items()}
        self.rollouts = int(state_dict["rollouts"])
        self._sampler_state = state_dict.get("sampler")
        if self.sampler is not None and self._sampler_state is not None:
            self.sampler.load_state_dict(self._sampler_state)
