"""A name → function table, so a string in a config selects an algorithm (verl style)."""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one family (advantage estimators, policy losses, ...) registered by name.

    Example:
        >>> ADV = Registry("advantage estimator")
        >>> @ADV.register("zero")
        ... def zero(rewards): return rewards * 0
        >>> ADV.get("zero") is zero
        True
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._table: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def add(fn: F) -> F:
            if name in self._table:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._table[name] = fn
            return fn

        return add

    def get(self, name: str) -> F:
        if name not in self._table:
            raise ValueError(
                f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._table))}"
            )
        return self._table[name]

    def names(self) -> list[str]:
        return sorted(self._table)

    def __contains__(self, name: str) -> bool:
        return name in self._table
