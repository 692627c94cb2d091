"""Environments for custom multi-turn tasks, Gymnasium/OpenEnv style, driven by the episode
loop one per sample: ``reset(row)`` gives the first observation, then after each model turn
``step(text)`` gives ``(observation, reward, done)``.

An environment may own the reward: the loop sums the rewards ``step`` returns over the episode
into the ``env_reward`` column, and `EnvironmentReward` hands it to the trainer like any other
reward function (so it mixes with others through ``reward_weights``).
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Protocol, Sequence, runtime_checkable


@runtime_checkable
class Environment(Protocol):
    """A multi-turn task. A fresh instance runs each episode (the factory makes one per sample).

    ``reset(row)``: the dataset row (prompt and every other column); returns an observation
    appended to the prompt as a ``user`` message, or ``""`` for none.

    ``step(text)``: the model's turn as text; returns ``(observation, reward, done)``:
    ``observation`` a ``str`` appended as a ``user`` message before the model's next turn, or
    None for none; ``reward`` a number added to the episode's ``env_reward``, or None for none;
    ``done`` a bool, True to end the episode.

    Examples:
        >>> class Guess:
        ...     def reset(self, row): self.target = row["target"]; return "Guess a number."
        ...     def step(self, text):
        ...         right = text.strip() == str(self.target)
        ...         return (None if right else "No."), float(right), right
        >>> isinstance(Guess(), Environment)
        True
    """

    def reset(self, row: dict[str, Any]) -> str: ...

    def step(self, text: str) -> tuple[str | None, float | None, bool]: ...


EnvironmentFactory = Callable[[], Environment]


def make_environment(factory: EnvironmentFactory) -> Environment:
    """A fresh environment from ``factory`` (a class or a zero-argument callable), checked to
    have ``reset`` and ``step``.

    Args:
        factory: what ``RLModule(environment=...)`` got.

    Examples:
        >>> class Echo:
        ...     def reset(self, row): return ""
        ...     def step(self, text): return None, 0.0, True
        >>> make_environment(Echo).step("hi")
        (None, 0.0, True)
    """
    if not callable(factory):
        raise TypeError(f"environment must be a class or a zero-argument callable that returns a fresh environment "
                        f"per episode, got a {type(factory).__name__} instance")
    env = factory()
    missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
    if missing:
        name = getattr(factory, "__name__", type(factory).__name__)
        raise TypeError(f"environment factory {name!r} made a {type(env).__name__} without {' and '.join(m + '()' for m in missing)}; an "
                        "environment needs reset(row) -> str and step(text) -> (observation, reward, done). If you "
                        "passed an instance, pass its class (or a lambda returning a new one) instead")
    return env


def check_reset(env: Any, result: Any) -> str:
    """``result`` of ``env.reset(row)`` if it is a ``str``, else `TypeError` naming the method.

    Examples:
        >>> class Bad:
        ...     pass
        >>> check_reset(Bad(), ["hi"])
        Traceback (most recent call last):
        TypeError: Bad.reset must return a str (the first observation, '' for none), got list ['hi']
    """
    if not isinstance(result, str):
        raise TypeError(f"{type(env).__name__}.reset must return a str (the first observation, '' for none), got "
                        f"{_show(result)}")
    return result


def check_step(env: Any, result: Any) -> tuple[str | None, float | None, bool]:
    """``result`` of ``env.step(text)`` as ``(observation, float reward or None, done)``, or
    `TypeError` naming ``ClassName.step`` and what was wrong.

    Accepted: a tuple or list of three; observation ``str`` or None; reward any real number
    except bool (numpy scalars included), finite, or None; done ``bool`` (numpy's too). A
    Gymnasium-style 5-tuple is refused with a hint, rather than guessed.

    Examples:
        >>> class Env:
        ...     pass
        >>> check_step(Env(), ("ok", 1, False))
        ('ok', 1.0, False)
        >>> check_step(Env(), ("ok", "1", False))
        Traceback (most recent call last):
        TypeError: Env.step must return (observation: str | None, reward: float | None, done: bool); reward is str '1'
    """
    method = f"{type(env).__name__}.step"
    expected = f"{method} must return (observation: str | None, reward: float | None, done: bool)"
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        hint = ("; for a Gymnasium 5-tuple return (observation, reward, terminated or truncated)"
                if isinstance(result, (tuple, list)) and len(result) == 5 else "")
        raise TypeError(f"{expected}, got {_show(result)}{hint}")
    observation, reward, done = result
    if observation is not None and not isinstance(observation, str):
        raise TypeError(f"{expected}; observation is {_show(observation)}")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
            raise TypeError(f"{expected}; reward is {_show(reward)}")
        reward = float(reward)
    if not isinstance(done, bool) and not _is_numpy_bool(done):
        raise TypeError(f"{expected}; done is {_show(done)}")
    return observation, reward, bool(done)


class EnvironmentReward:
    """A reward function (TRL signature) that returns each episode's summed environment reward,
    which the episode loop writes in the ``env_reward`` column (0.0 when ``step`` never gave one).

    Args:
        column: the column to read.

    Examples:
        >>> EnvironmentReward()(["q", "q"], ["a", "b"], env_reward=[1.0, 0.5])
        [1.0, 0.5]
    """

    __name__ = "env"  # logged as rewards/env/...

    def __init__(self, column: str = "env_reward"):
        self.column = column

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        if self.column not in columns:
            raise KeyError(f"EnvironmentReward reads column {self.column!r}, which the episode loop writes only when "
                           f"RLModule(environment=...) is set; the batch has {sorted(columns)}")
        values = list(columns[self.column])
        if len(values) != len(completions):
            raise ValueError(f"column {self.column!r} has {len(values)} values for {len(completions)} completions")
        return [0.0 if v is None else float(v) for v in values]


def _is_numpy_bool(value: Any) -> bool:
    """numpy's bool scalar (``bool_``; ``bool`` in numpy 2), without importing numpy."""
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"
