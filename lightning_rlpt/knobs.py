"""What callbacks may move and what they may ask for: the typed surface of `RLModule` that
callbacks touch, the way Lightning's callbacks touch ``trainer.should_stop``.

- `Knobs`: values a callback may set for the coming optimizer steps (``module.knobs``);
  checkpointed once, by the module.
- `Requests`: extra tensors a callback needs, asked for with ``module.request(...)`` in
  ``setup``; a request is never withdrawn, so two callbacks cannot undo each other.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class Knobs:
    """Args:
        kl_coef: β of the KL-to-reference term (``EntropyGatedKL``, ``AccuracyConditionedKL``).
        clip_low / clip_high: the policy loss's clip range (``BAPO``).
    """

    kl_coef: float
    clip_low: float
    clip_high: float

    def state_dict(self) -> dict[str, float]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, float(state[f.name]))


@dataclass
class Requests:
    """Args:
        old_logprobs: recompute π_old before ``on_advantages_computed`` even on-policy
            (``ESSScaledLR`` reads it before the loss).
        ref_entropy: the reference forward also returns per-token entropies, as
            ``experience.info["ref_entropy"]`` (``ResponseWeightedKL``).
        rollout_logprobs: the built-in HF engine reports behaviour log-probs.
    """

    old_logprobs: bool = False
    ref_entropy: bool = False
    rollout_logprobs: bool = False

    def ask(self, **flags: bool) -> None:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(flags) - known)
        if unknown:
            raise TypeError(f"unknown request(s) {unknown}; known: {sorted(known)}")
        for name, wanted in flags.items():
            setattr(self, name, getattr(self, name) or bool(wanted))
