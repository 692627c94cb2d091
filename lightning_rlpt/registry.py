"""A name → function table, so a string in a config selects an algorithm (verl style).

Each family declares the traits its members may state (with defaults) and each function states
its own where it is registered, so facts about an algorithm live next to it, not in scattered
sets: ``@POLICY_LOSSES.register("decoupled_ppo", self_correcting=True)``.
"""
from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one family (advantage estimators, policy losses, ...) registered by name.

    Args:
        kind: the family's name in messages ("policy loss").
        traits: the traits a member may declare, with their defaults.

    Example:
        >>> ADV = Registry("advantage estimator", traits={"group_relative": False})
        >>> @ADV.register("zero", group_relative=True)
        ... def zero(rewards): return rewards * 0
        >>> ADV.get("zero") is zero, ADV.trait("zero", "group_relative"), ADV.names(group_relative=True)
        (True, True, ['zero'])
    """

    def __init__(self, kind: str, traits: dict[str, Any] | None = None):
        self.kind = kind
        self.defaults = dict(traits or {})
        self._table: dict[str, F] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        unknown = sorted(set(traits) - set(self.defaults))
        if unknown:
            raise TypeError(f"{self.kind} {name!r} declares unknown trait(s) {unknown}; known: {sorted(self.defaults)}")

        def add(fn: F) -> F:
            if name in self._table:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._table[name] = fn
            self._traits[name] = {**self.defaults, **traits}
            return fn

        return add

    def get(self, name: str) -> F:
        self._known(name)
        return self._table[name]

    def trait(self, name: str, trait: str) -> Any:
        self._known(name)
        return self._traits[name][trait]

    def names(self, **where: Any) -> list[str]:
        """Sorted names, optionally only those whose traits equal ``where``."""
        return sorted(n for n, t in self._traits.items() if all(t[k] == v for k, v in where.items()))

    def __contains__(self, name: str) -> bool:
        return name in self._table

    def _known(self, name: str) -> None:
        if name not in self._table:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._table))}")
