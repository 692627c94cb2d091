"""A name → function table, so a string in a config selects an algorithm (verl style).

Each family declares the traits its members may state (with defaults) and each function states
its own where it is registered, so facts about an algorithm live next to it, not in scattered
sets: ``@POLICY_LOSSES.register("decoupled_ppo", self_correcting=True)``.

A member's options are its parameters with a default; `Registry.check_options` refuses a key
that is not one of them, so a misspelt option fails at construction instead of being ignored.
A trailing ``**_`` only swallows what the caller passes to every member (a loss's clip ranges);
a member that reads arbitrary options itself names its ``**kwargs`` otherwise and is not checked.
"""
from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Generic, Iterable, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one family (advantage estimators, policy losses, ...) registered by name.

    Args:
        kind: the family's name in messages ("policy loss").
        traits: the traits a member may declare, with their defaults.

    Examples:
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

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's or a notebook's own member, so it can be registered again)."""
        self._known(name)
        del self._table[name], self._traits[name]

    def get(self, name: str) -> F:
        self._known(name)
        return self._table[name]

    def trait(self, name: str, trait: str) -> Any:
        self._known(name)
        return self._traits[name][trait]

    def names(self, **where: Any) -> list[str]:
        """Sorted names, optionally only those whose traits equal ``where``."""
        return sorted(n for n, t in self._traits.items() if all(t[k] == v for k, v in where.items()))

    def options(self, name: str) -> dict[str, Any] | None:
        """``name``'s options with their defaults (None: it takes any, through a ``**kwargs`` not named ``_``)."""
        params = inspect.signature(self.get(name)).parameters.values()
        if any(p.kind is p.VAR_KEYWORD and p.name != "_" for p in params):
            return None
        return {p.name: p.default for p in params
                if p.default is not p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def check_options(self, name: str, given: dict[str, Any] | None, argument: str,
                      supplied: Iterable[str] = ()) -> dict[str, Any]:
        """``given`` over ``name``'s defaults, refusing a key ``name`` does not take or one the
        caller ``supplied`` itself to every member.

        Args:
            name: the selected member.
            given: the user's options (None: none).
            argument: where they came from, for messages (``"policy_loss_kwargs"``).
            supplied: keys the caller passes to every member itself; never the user's to set.
        """
        given, defaults, supplied = dict(given or {}), self.options(name), set(supplied)
        if defaults is None:
            return given
        own = sorted(set(defaults) - supplied)
        for key in given:
            if key in supplied:
                raise ValueError(f"{argument}[{key!r}]: the module passes {key!r} to every {self.kind} itself; "
                                 f"drop it from {argument} (the module fills it from its own arguments and "
                                 "state, e.g. a loss's clip ranges from RLModule(clip_low=..., clip_high=...))")
            if key not in defaults:
                close = difflib.get_close_matches(str(key), own, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{argument}[{key!r}]: {self.kind} {name!r} has no option {key!r}{hint}; "
                                 f"its options: {', '.join(own) or 'none'}")
        return {**{k: defaults[k] for k in own}, **given}

    def __contains__(self, name: str) -> bool:
        return name in self._table

    def _known(self, name: str) -> None:
        if name not in self._table:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._table))}")
