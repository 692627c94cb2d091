"""What callbacks may move and what they may ask for: the typed surface of `RLModule` that
callbacks touch, the way Lightning's callbacks touch ``trainer.should_stop``.

- `Knobs`: values a callback may set for the coming optimizer steps (``module.knobs``);
  checkpointed once, by the module. A knob has one owner: a callback that moves one claims it
  in ``setup``, and a second claimant on the same Trainer is refused (two writers of one knob
  would silently leave the later one's value).
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

    def __post_init__(self) -> None:
        self._owners: dict[str, Any] = {}  # knob -> the callback that moves it (not a field: not checkpointed)

    def claim(self, name: str, owner: Any, trainer: Any = None) -> None:
        """Make ``owner`` the one writer of knob ``name``; call it in the callback's ``setup``.

        A claim lasts while its owner is one of ``trainer.callbacks``: the same callbacks fitting
        again (a Trainer re-used, a second ``fit``) re-claim their own knobs, and a new Trainer
        without the old owner takes the knob over, so claims never outlive the fit that made them.

        Args:
            name: a field of `Knobs` (``kl_coef``, ``clip_low``, ``clip_high``).
            owner: the claiming callback.
            trainer: the Trainer being set up (None: any earlier claimant by another owner is
                still active).

        Raises:
            ValueError: ``name`` is not a knob, or another active callback owns it (both named).

        Examples:
            >>> knobs, first, second = Knobs(0.0, 0.2, 0.2), object(), object()
            >>> knobs.claim("kl_coef", owner=first)
            >>> knobs.claim("kl_coef", owner=first)  # re-claiming one's own knob is fine
            >>> knobs.claim("kl_coef", owner=second)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: knob 'kl_coef' is already moved by object; object would move it too, ...
        """
        known = [f.name for f in fields(self)]
        if name not in known:
            raise ValueError(f"{type(owner).__name__} claims knob {name!r}, which does not exist; knobs: {known}")
        held = self._owners.get(name)
        active = held is not None and (trainer is None or any(cb is held for cb in getattr(trainer, "callbacks", [])))
        if active and held is not owner:
            raise ValueError(f"knob {name!r} is already moved by {type(held).__name__}; {type(owner).__name__} would "
                             "move it too, and the one listed later would silently overwrite the other every step: "
                             "keep one of them on the Trainer")
        self._owners[name] = owner

    def owner(self, name: str) -> Any:
        """The callback that claimed knob ``name`` (None if none did)."""
        return self._owners.get(name)

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
