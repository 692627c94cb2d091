"""`PolicyUpdate`: RLModule's training step after the experience is made (step 5-6 of the walk).

A rollout is trained on for ``updates_per_rollout`` passes of mini-batches, one optimizer step
each. A mini-batch runs as micro-batches (`MicroBatching`): one forward and backward each, the
gradients accumulating, so the step's gradient is the one-pass gradient. That holds for every
aggregation mode because each is a sum over rows or tokens divided by a constant of the whole
mini-batch (its global token and sequence counts, or ``max_new_tokens``), which every
micro-batch's loss uses; ``seq-mean-token-mean``'s per-sequence means never cross rows.

``top_entropy_quantile`` < 1 keeps the policy-gradient term on the mini-batch's highest-entropy
tokens only (`algorithms.entropy_mask`). Its threshold is a quantile over the whole mini-batch
on every rank, so micro-batching must not change it: in one pass the loss forward's own
entropies give it (gathered over ranks, as TRL does); with micro-batches a no-grad forward of
the mini-batch, chunked like them, measures the entropies first (the policy does not move
within a step, so they are those the loss forwards see). That costs one extra no-grad forward
per optimizer step, only when both options are on.
"""
from __future__ import annotations

import math
import time
import warnings
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..algorithms.aggregation import aggregate_loss
from ..algorithms.correction import mismatch_metrics
from ..algorithms.entropy_bonus import entropy_bonus
from ..algorithms.entropy_mask import entropy_threshold, high_entropy_mask
from ..algorithms.kl import kl_metric
from ..algorithms.surrogate import surrogate
from ..batching import minibatch_orders
from ..experience import Experience
from ..hooks import call_hook
from ..model.distributed import reduce_over_ranks
from ..model.trainer_checks import adopt_trainer_knobs
from ..model.weights import grad_norm
from ..progress import count_steps
from ..quiet import quiet_fit
from .step_metrics import add_metrics, clip_extremes, reduce_extremes
from .timing import seconds_since

if TYPE_CHECKING:  # the annotations of what the stage reads (`PolicyUpdate`'s surface)
    from torch import nn

    from ..algorithms.presets import Objective
    from ..batching import MicroBatching
    from ..knobs import Knobs
    from ..rollout import SamplingConfig
    from .head_in_forward import HeadInForward
    from .timing import StepTimer

# Empty batches in a row that stop a run: a whole epoch of them, but at least EMPTY_BATCHES_MIN (in a
# short epoch a few can be chance: dynamic filtering early on) and at most EMPTY_BATCHES_LIMIT (also
# the count for a loader without a length).
EMPTY_BATCHES_MIN, EMPTY_BATCHES_LIMIT = 100, 1000
PROGRESS_BAR = ("reward", "kl", "entropy", "throughput/tokens_per_s")


class PolicyUpdate:
    """Mixin of `RLModule` (which supplies the policy, the knobs and the hyper-parameters)."""

    # What this stage reads of the module besides Lightning's own attributes: set by `RLModule`
    # (or by `MakeExperience`: the last three). tests/meta/test_stage_surfaces.py checks that the
    # stage touches nothing else and that nothing listed is unused.
    UPDATE_SETTINGS = ("entropy_coef", "mask_truncated_completions", "max_grad_norm", "minibatch_size",
                       "rollout_correction", "rollout_correction_cap", "rollout_correction_kl", "top_entropy_quantile",
                       "updates_per_rollout")
    policy: nn.Module
    objective: Objective
    kl_estimator: str
    policy_loss_kwargs: dict[str, Any]
    knobs: Knobs
    sampling: SamplingConfig
    micro_batching: MicroBatching
    head_in_forward: HeadInForward
    timer: StepTimer
    policy_version: int
    rng: torch.Generator
    _agree_count: Callable[[int], int]
    _log_dict: Callable[..., None]
    policy_logprobs: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    make_experience: Callable[[dict[str, list[Any]]], Experience | None]
    sync_engine: Callable[..., None]
    _logprobs: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]

    def training_step(self, batch: dict[str, list[Any]], batch_idx: int) -> None:
        start = time.perf_counter()
        exp = self.make_experience(batch)
        if exp is None:
            self._count_empty_batch()
            return None
        self._empty_batches = 0
        opt = self.optimizers()
        totals: dict[str, float] = {}
        steps = 0
        for rows in minibatch_orders(len(exp), self.hparams.minibatch_size, self.hparams.updates_per_rollout, self.rng):
            minibatch = call_hook(self.trainer, self, "on_before_loss", exp.select(rows))
            with self.timer("update"):
                stats = self.accumulate_gradients(minibatch)
                learning_rate = opt.optimizer.param_groups[0]["lr"]  # the rate this step uses (TRL's too)
                opt.step()  # clipping runs in on_before_optimizer_step, after AMP unscaling
                self.step_scheduler()
                opt.zero_grad(set_to_none=True)  # free the gradients until the next backward needs them
                if getattr(self, "_grad_norm", None) is not None:
                    stats["grad_norm"] = self._grad_norm
            self.policy_version += 1
            with self.timer("weight_sync"):
                self.sync_engine(force=False)
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1
        metrics = {k: v / steps for k, v in totals.items()}
        metrics.update(self.timer.pop())
        tokens = reduce_over_ranks(self._trainer, [float(exp.prompt_mask.sum() + exp.completion_mask.sum())])[0]
        seconds = seconds_since(start)
        metrics["throughput/tokens_per_s"] = tokens / max(seconds, 1e-9)
        # TRL's step_time is seconds per optimizer step (its generation included), as here.
        metrics.update(step_time=seconds / steps, learning_rate=learning_rate)
        if self.hparams.entropy_coef:  # TRL logs it whenever the bonus is on; once, not per micro-batch
            metrics["entropy_coef"] = self.hparams.entropy_coef
        self._log_dict(metrics, prog_bar_keys=PROGRESS_BAR)
        self._warn_overshoot(steps)

    # Set once a batch's step count was found not to divide max_steps (`_warn_overshoot`).
    _warned_overshoot: bool = False

    def _warn_overshoot(self, steps: int) -> None:
        """Lightning compares ``max_steps`` with the optimizer steps only between batches, and a batch
        takes ``steps`` of them (``updates_per_rollout`` × mini-batches): say once, on the first such
        batch, that the run will end past ``max_steps``, and by how much."""
        limit = self.trainer.max_steps
        if self._warned_overshoot or steps <= 1 or limit is None or limit <= 0 or limit % steps == 0:
            return
        self._warned_overshoot = True
        end = math.ceil(limit / steps) * steps
        warnings.warn(f"each training batch takes {steps} optimizer steps (updates_per_rollout × mini-batches), and "
                      f"max_steps={limit} is not a multiple of {steps}: Lightning checks max_steps between batches, so "
                      f"this run will take {end} optimizer steps. Set max_steps={end - steps} or {end} to say what "
                      "you will get", UserWarning, stacklevel=2)

    # Training batches in a row that the hooks left empty (each skips its step).
    _empty_batches: int = 0

    def _count_empty_batch(self) -> None:
        """An empty batch takes no optimizer step, so the Trainer's ``max_steps`` comes no nearer: a
        run whose every batch is emptied would loop over epochs forever. A whole epoch of them in a
        row, bounded as the constants above say (the same count on every rank: the ranks agreed to
        skip), stops the run instead."""
        self._empty_batches += 1
        epoch = self.trainer.num_training_batches
        limit = min(max(int(epoch), EMPTY_BATCHES_MIN), EMPTY_BATCHES_LIMIT) if epoch != float("inf") \
            else EMPTY_BATCHES_LIMIT
        if self._empty_batches >= limit:
            raise RuntimeError(
                f"the last {self._empty_batches} training batches in a row were all empty after the RL hooks, "
                f"so no optimizer step was taken since global step {self.trainer.global_step} and max_steps would "
                "never be reached. A filter drops every row (e.g. dynamic filtering when every group's rewards are "
                "equal: a reward that cannot tell completions apart, or a task far too easy or too hard); check the "
                "rewards of the last batches (reward, frac_reward_zero_std) and the callbacks that remove rows")

    def accumulate_gradients(self, minibatch: Experience) -> dict[str, float]:
        """Zero the gradients, then forward and backward every micro-batch of ``minibatch``;
        returns the mini-batch's metrics (sums of the micro-batches' shares; `step_metrics`'
        extremes over its sequences on every rank)."""
        mask = self.loss_mask(minibatch)
        # global (tokens, sequences), then this rank's tokens (bnpo's denominator)
        counts = (*reduce_over_ranks(self._trainer, [mask.sum().item(), float(mask.shape[0])]), mask.sum().item())
        threshold, kept = self._minibatch_entropy_threshold(minibatch, mask)
        chunks = self._agreed_split(minibatch)
        self.optimizers().zero_grad()
        totals: dict[str, float] = {}
        current = torch.zeros_like(minibatch.completion_mask, dtype=torch.float32)
        for i, rows in enumerate(chunks):
            dummy = rows is None  # an FSDP2 rank with fewer micro-batches joins the others' collectives
            micro = minibatch.select(rows if rows is not None else [0]).trim()
            loss, stats, logp = self.loss_and_logprobs(micro, counts=counts, entropy_threshold=threshold, kept_tokens=kept)
            with self._backward_sync(last=i == len(chunks) - 1):
                self.manual_backward(loss * 0.0 if dummy else loss)
            if dummy:
                continue
            current[rows.to(current.device), :logp.shape[1]] = logp.float()
            add_metrics(totals, stats)
        reduce_extremes(self._trainer, totals)
        if minibatch.old_logprobs is None and minibatch.behaviour_logprobs is not None:
            # The single on-policy pass: π_old is the current policy (see `_fill_logprobs`).
            totals.update(mismatch_metrics(current, minibatch.behaviour_logprobs, mask))
        return totals

    def loss_mask(self, mb: Experience) -> torch.Tensor:
        """``[N, C]`` float, 1 on the tokens the loss trains on (`Experience.trained_mask` under
        this module's ``mask_truncated_completions``). Public (`hooks.PUBLIC_SURFACE`): callbacks
        measure their statistics over exactly these tokens.

        Args:
            mb: the (mini-/micro-)batch.
        """
        return mb.trained_mask(self.hparams.mask_truncated_completions)

    def loss(self, mb: Experience, counts: tuple[float, float] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective on (a micro-batch of) a mini-batch: ``(loss, metrics)``. ``counts`` are
        the mini-batch's global (token, sequence) counts that every aggregation mode divides by,
        and optionally this rank's token count that ``bnpo`` divides by (default: ``mb``'s own,
        summed over ranks; ``mb``'s tokens)."""
        return self.loss_and_logprobs(mb, counts)[:2]

    def loss_and_logprobs(self, mb: Experience, counts: tuple[float, float] | None = None,
                          entropy_threshold: torch.Tensor | None = None, kept_tokens: float | None = None
                          ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """`loss`, and the detached current log-probs it computed. ``entropy_threshold``: the
        mini-batch's high-entropy threshold (default: from this forward's entropies, all ranks);
        ``kept_tokens``: how many tokens it keeps over the mini-batch (default: this forward's, all ranks)."""
        mask = self.loss_mask(mb)
        if counts is None:
            counts = reduce_over_ranks(self._trainer, [mask.sum().item(), float(mask.shape[0])])
        if self.head_in_forward.eligible(self, mb):
            return self.head_in_forward.loss(self, mb, mask, counts, entropy_threshold, kept_tokens)
        logp, entropy = self.policy_logprobs(mb, with_entropy=True, entropy_grad=self.hparams.entropy_coef != 0)
        logp = logp if logp.dtype == torch.float64 else logp.float()  # the loss in fp32 at least, whatever the model's
        loss, metrics = self.objective_terms(mb, logp, entropy, mask, counts, entropy_threshold, kept_tokens)
        return loss, metrics, logp.detach()

    def objective_terms(self, mb: Experience, logp: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor,
                        counts: tuple[float, ...], entropy_threshold: torch.Tensor | None = None,
                        kept_tokens: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss and its metrics from the policy's log-probs and entropies of ``mb``'s
        completions: the objective alone, no forward. ``mb`` may be any set of whole rows of the
        mini-batch: with its global ``counts`` the shares of disjoint row sets add up to the loss
        of their union (what micro-batching and `HeadInForward` rely on)."""
        tokens, seqs, *local = counts
        world = self.trainer.world_size if self._trainer is not None else 1

        def token_mean(values: torch.Tensor) -> float:
            # × world / global tokens, then the mean over ranks at logging = the global token mean;
            # a per-sequence stat ([N]: GSPO's clip decisions, VESPO's φ) is a mean over sequences (TRL's)
            if values.dim() == 1:
                return float(values.detach().float().sum()) * world / max(seqs, 1.0)
            return float((values.detach().float() * mask).sum()) * world / max(tokens, 1.0)

        coef = self.hparams.entropy_coef
        policy_mask = self._high_entropy_mask(entropy, mask, entropy_threshold)
        old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
        per_token, stats = surrogate(
            mb, logp, old, mask, policy_loss=self.objective.policy_loss, kl_estimator=self.kl_estimator,
            kl_coef=self.knobs.kl_coef, correction=self.hparams.rollout_correction,
            correction_cap=self.hparams.rollout_correction_cap,
            correct_kl=self.hparams.rollout_correction_kl,
            loss_options=dict(clip_low=self.knobs.clip_low, clip_high=self.knobs.clip_high,
                              dual_clip=self.objective.dual_clip, staleness=self.policy_version - mb.policy_version,
                              **self.policy_loss_kwargs), policy_mask=policy_mask)
        metrics = {f"{k}_mean": token_mean(v) for k, v in stats.items()}
        metrics.update(clip_extremes(stats, mask))  # clip_ratio/low_min, high_max: min/max over sequences
        metrics["entropy"] = token_mean(entropy)
        if policy_mask is not None:
            metrics["top_entropy/kept_fraction"] = token_mean(policy_mask)
        if mb.ref_logprobs is not None:
            metrics["kl"] = token_mean(kl_metric(self.kl_estimator, logp, mb.ref_logprobs, old, mask))
        # DDP averages gradients over ranks; scaling by the world size makes that a global sum.
        loss = world * aggregate_loss(per_token, mask, self.objective.loss_aggregation, num_tokens=tokens,
                                      num_seqs=seqs, norm_length=self.sampling.max_new_tokens,
                                      local_tokens=local[0] if local else mask.sum().item(), num_ranks=world)
        if coef:  # TRL's sign and normaliser (`algorithms.entropy_bonus`); its policy_loss is the loss before it
            metrics["policy_loss"] = loss.item()
            acted_on = tokens if policy_mask is None else self._kept_tokens(mask, policy_mask, kept_tokens)
            loss = loss - world * coef * entropy_bonus(entropy, mask, acted_on, policy_mask)
        metrics["loss"] = loss.item()  # world × this rank's share: the mean over ranks is the global loss
        return loss, metrics

    def step_scheduler(self) -> None:
        """Manual optimization leaves schedulers to the module: one step per optimizer step."""
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()

    def configure_callbacks(self) -> list:
        """No callbacks of its own: this is the one hook Lightning calls before refusing, under
        manual optimization, ``Trainer(gradient_clip_val=...)``; `adopt_trainer_knobs` takes that
        value as ``max_grad_norm`` first (and refuses ``accumulate_grad_batches``, clipping by value).
        The progress bar then counts optimizer steps, and Lightning's advice that is wrong for an RL
        run is silenced (`lightning_rlpt.progress`, `lightning_rlpt.quiet`)."""
        adopt_trainer_knobs(self)
        count_steps(self.trainer)
        quiet_fit()
        return []

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """Lightning calls this after AMP unscaling: log the gradient norm, then clip through
        `clip_gradients`, so precision plugins and strategies see the clipping."""
        params = [p for p in self.policy.parameters() if p.grad is not None]
        self._grad_norm = grad_norm(params) if params else None
        if self.hparams.max_grad_norm:
            self.clip_gradients(optimizer, gradient_clip_val=self.hparams.max_grad_norm, gradient_clip_algorithm="norm")

    # ---------------------------------------------------------------- high-entropy tokens
    def _high_entropy_mask(self, entropy: torch.Tensor, mask: torch.Tensor,
                           threshold: torch.Tensor | None) -> torch.Tensor | None:
        """The tokens that keep their policy gradient (None: all, ``top_entropy_quantile`` = 1)."""
        rho = self.hparams.top_entropy_quantile
        if rho >= 1:
            return None
        if threshold is None:  # one pass: this forward holds the whole mini-batch
            threshold = entropy_threshold(entropy, mask, rho, self._gather_tokens)
        return high_entropy_mask(entropy, mask, threshold)

    def _minibatch_entropy_threshold(self, minibatch: Experience, mask: torch.Tensor
                                     ) -> tuple[torch.Tensor | None, float | None]:
        """With micro-batches, the threshold over the whole mini-batch from a no-grad forward
        chunked like them, and the count of tokens it keeps on every rank (the entropy bonus's
        normaliser); (None, None) when the loss forward can compute them itself."""
        rho = self.hparams.top_entropy_quantile
        if rho >= 1 or not self.micro_batching.active:
            return None, None
        with torch.no_grad():
            entropy = self._logprobs(self.policy, minibatch, with_entropy=True)[1]
        threshold = entropy_threshold(entropy, mask, rho, self._gather_tokens)
        return threshold, self._kept_tokens(mask, high_entropy_mask(entropy, mask, threshold), None)

    def _kept_tokens(self, mask: torch.Tensor, policy_mask: torch.Tensor, known: float | None) -> float:
        """The trained tokens ``top_entropy_quantile`` keeps, over every rank (``known`` when given)."""
        if known is not None:
            return known
        return reduce_over_ranks(self._trainer, [float((mask * policy_mask).sum())])[0]

    def _gather_tokens(self, values: torch.Tensor) -> torch.Tensor:
        """Every rank's 1-D ``values`` concatenated (each padded to the longest with -inf for the
        all-gather, the padding then dropped; entropies are never -inf)."""
        if self._trainer is None or self.trainer.world_size == 1:
            return values
        longest = int(reduce_over_ranks(self._trainer, [values.numel()], op="max")[0])
        if longest == 0:
            return values
        padded = values.new_full((longest,), float("-inf"))
        padded[:values.numel()] = values
        gathered = self.all_gather(padded).flatten()
        return gathered[gathered > float("-inf")]

    # ---------------------------------------------------------------- plumbing
    def _agreed_split(self, minibatch: Experience) -> list[torch.Tensor | None]:
        """The micro-batches' rows; under FSDP2 every rank runs as many forwards as the rank with
        the most (padded with None: a zero-weight pass), since each forward gathers parameters."""
        chunks: list[torch.Tensor | None] = list(self.micro_batching.split(minibatch))
        return chunks + [None] * (self._agree_count(len(chunks)) - len(chunks))

    def _backward_sync(self, last: bool):
        """DDP all-reduces gradients on the last micro-batch only (`no_sync` before it)."""
        block = getattr(self.trainer.strategy, "block_backward_sync", None)
        return nullcontext() if last or block is None else block()
