"""Sampling parity at run time: does the engine sample from the policy the trainer holds?

An engine that holds other weights than the policy's (a tied head the reload left stale, a
parameter a sync skipped, a dtype or quantization that changes the model, an engine that ignored
a sync) still returns plausible completions, and the importance ratios of the mismatch
correction absorb much of the difference: the run looks healthy while the loss is computed on
another policy's samples. So, before the training rollout that follows the first sync of a fit
and then at the first sync past each multiple of ``every × sync_every`` optimizer steps, one prompt is
completed greedily by the engine (``tokens`` tokens, with the sampled tokens' log-probs) and the
trainer scores the same tokens with its own log-prob path (the loss's: fused head, soft-cap,
FSDP2). ``sampling/parity_max`` is the largest |Δ log p|; above ``threshold`` the run stops
before the step, naming the engine, the step, the value and the likely causes.

The probe runs only when the engine holds the policy's current weights (``held_version ==
policy_version``): between syncs (``sync_every > 1``) a gap is staleness, which the importance
ratio measures, not a fault. It samples greedily from a fixed seed and draws nothing from the
module's seed stream, so a run with the probe samples the same completions as one without.

Default threshold ``"auto"``: 1e-2 when both sides compute in fp32 (or fp64), where engines
measured here agree to ~1e-6 (tests/zoo; Gemma-2's soft-capped logits on vLLM to 8e-4) while every
fault seen (a stale tied head: 0.55; one skipped parameter: > 0.05) is far above; ``LOW_PRECISION``
(0.3) when either side runs in bf16/fp16, where two correct bf16 computations (vLLM's kernels and
HF's forward) were measured up to 0.06 apart and each up to ~0.13 off fp32
(tests/rollout/test_vllm_precision.py): the stale head is still caught, a skipped parameter may not be.
Cost: one greedy generation of ``GREEDY_TOKENS`` tokens and one forward of the prompt plus them
(docs/vllm.md gives the measured share of a step).

Examples:
    >>> probe = ParityProbe(every=10, threshold=1e-2)
    >>> probe.due(held_version=0, policy_version=0, sync_every=1)
    True
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from .sampling import SamplingConfig

GREEDY_TOKENS = 4
EXACT, LOW_PRECISION = 1e-2, 0.3  # the "auto" threshold: fp32 on both sides, or bf16/fp16 on either
CAUSES = ("a tied embedding/LM head the engine did not reload (weights synced under one name only)",
          "a parameter the weight sync skipped or renamed",
          "the engine's dtype or quantization differs from the trainer's (bf16/fp16 engines need a looser threshold)",
          "an engine whose sync_weights did not copy the weights it was sent")

# ``logprobs_of(ids [1, P + C], completion_len C) -> [C]``: the trainer's log-probs of the last C tokens.
LogprobsOf = Callable[[torch.Tensor, int], torch.Tensor]


class ParityProbe:
    """When to probe and what to do with the result (see the module docstring).

    Args:
        every: syncs between probes after the first (≥ 1); None or 0: never probe.
        threshold: the largest |Δ log p| accepted; ``"auto"``: ``EXACT`` (1e-2) when the trainer and
            the engine compute in fp32, ``LOW_PRECISION`` (0.3) when either runs in bf16/fp16;
            None: measure and log only.
    """

    def __init__(self, every: int | None = 10, threshold: float | str | None = "auto"):
        if every is not None and (not isinstance(every, int) or every < 0):
            raise ValueError(f"parity_every must be a number of weight syncs >= 1 (or 0/None: never probe), got {every!r}")
        if threshold != "auto" and threshold is not None and not (isinstance(threshold, (int, float)) and threshold > 0):
            raise ValueError(f"parity_threshold must be > 0, 'auto' (1e-2 in fp32, 0.3 in bf16/fp16) or None (log "
                             f"sampling/parity_max, never stop), got {threshold!r}")
        self.every, self.threshold = int(every or 0), threshold
        self.last: int | None = None  # the policy version last probed in this fit
        self.prompt: list[int] | None = None  # the prompt last probed (a returning server's probe reuses it)
        self.worst: str | None = None  # the server with the largest gap, for an engine over several
        self._warned = False

    def reset(self) -> None:
        """A new fit probes at its first sync again (a resumed run too)."""
        self.last = None

    def due(self, held_version: int, policy_version: int, sync_every: int) -> bool:
        if not self.every or int(held_version) != int(policy_version):
            return False
        # After a fit's first probe, the first sync at or past each multiple of the period: the same
        # steps in a straight run and a resumed one (which probes its fresh engine first as well).
        period = self.every * max(int(sync_every), 1)
        return self.last is None or int(policy_version) // period > self.last // period

    def measure(self, engine: Any, prompt: list[int], logprobs_of: LogprobsOf, policy_version: int) -> float | None:
        """|Δ log p| over ``GREEDY_TOKENS`` greedy tokens of ``prompt``, or None (and a warning,
        once) for an engine that cannot report log-probs. An engine over several servers
        (``parity_targets()``: name → a view of one server) is measured on each; the worst is kept
        (``self.worst`` names it)."""
        self.last, self.prompt = int(policy_version), list(prompt)
        targets = engine.parity_targets() if hasattr(engine, "parity_targets") else {None: engine}
        gaps = {name: self.gap(view, prompt, logprobs_of) for name, view in targets.items()}
        if not gaps or None in gaps.values():
            self._warn_unprobed(engine)
            return None
        self.worst = max(gaps, key=gaps.get)
        return gaps[self.worst]

    def gap(self, engine: Any, prompt: list[int], logprobs_of: LogprobsOf) -> float | None:
        """One engine's largest |Δ log p| on ``prompt`` (None: it reports no log-probs)."""
        with reporting_logprobs(engine) as able:
            out = engine.generate([list(prompt)], SamplingConfig(max_new_tokens=GREEDY_TOKENS, temperature=0.0), 0) \
                if able else None
        if out is None or out.logprobs is None or not out.completion_ids[0]:
            return None
        completion = list(out.completion_ids[0])
        ids = torch.tensor([list(prompt) + completion])
        ours = logprobs_of(ids, len(completion)).reshape(-1).float().cpu()
        theirs = torch.tensor(out.logprobs[0], dtype=torch.float32)
        gap = (ours - theirs).abs().max().item()
        return gap if math.isfinite(gap) else math.inf

    def limit(self, low_precision: bool = False) -> float | None:
        """The threshold in force (``"auto"`` resolved for the precision of the two sides)."""
        if self.threshold == "auto":
            return LOW_PRECISION if low_precision else EXACT
        return self.threshold

    def check(self, gap: float, engine: Any, where: str, low_precision: bool = False) -> None:
        """Stop before the step when ``gap`` is above the threshold."""
        limit = self.limit(low_precision)
        if limit is None or gap <= limit:
            return
        causes = "; ".join(CAUSES)
        server = f" (server {self.worst})" if self.worst else ""
        raise RuntimeError(
            f"the rollout engine {type(engine).__name__}{server} does not sample from the policy the trainer holds at "
            f"{where}: the largest log-prob gap on a greedy probe is {gap:.3g} > parity_threshold={limit} "
            f"(sampling/parity_max). Training on its samples would train on another policy's. Likely causes: {causes}. "
            "Not training this step: fix the engine (docs/vllm.md, 'Sampling parity'), or raise parity_threshold "
            "only if the engine runs at a lower precision on purpose")

    def check_rejoined(self, engine: Any, logprobs_of: LogprobsOf, low_precision: bool = False) -> None:
        """A server that returns after a drop samples again only if it passes the probe (on the
        prompt last probed): ``ValueError`` (the pool drops it again) otherwise."""
        gap, limit = self.gap(engine, self.prompt or list(range(1, 9)), logprobs_of), self.limit(low_precision)
        if gap is not None and limit is not None and gap > limit:
            raise ValueError(f"its sampling-parity gap {gap:.3g} is above parity_threshold={limit}: it does "
                             "not sample from the policy the trainer holds")


def low_precision(trainer_precision: Any, engine: Any) -> bool:
    """Whether the trainer (Lightning's ``precision``) or the engine (its ``dtype``, when it says)
    computes in bf16/fp16."""
    dtype = str(getattr(engine, "dtype", "") or "").replace("torch.", "")
    return not str(trainer_precision).startswith(("32", "64")) or dtype in ("bfloat16", "float16", "half")

    def _warn_unprobed(self, engine: Any) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"the rollout engine {type(engine).__name__} reports no log-probs, so its sampling parity "
                          "cannot be probed (sampling/parity_max is not logged). Set return_logprobs=True on it to "
                          "have it checked", UserWarning, stacklevel=3)


@contextmanager
def reporting_logprobs(engine: Any) -> Iterator[bool]:
    """The engine reports log-probs inside (an engine with a settable ``return_logprobs``, such as
    the HF engine, is switched on for the probe only); yields whether it can."""
    before, switched = bool(getattr(engine, "return_logprobs", False)), False
    if not before:
        try:
            engine.return_logprobs, switched = True, True
        except AttributeError:  # a read-only property: the engine never reports them
            pass
    try:
        yield before or switched
    finally:
        if switched:
            engine.return_logprobs = False
