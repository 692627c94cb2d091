"""Reward functions named by import path, their logged names, and whether they are ``async``."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from typing import Any, Callable, Sequence

from .model import RewardModel, looks_like_reward_model

RewardFn = Callable[..., Sequence[float | None]]


def reward_name(fn: RewardFn) -> str:
    """The name a reward is logged under (``rewards/<name>/...``): its ``__name__``, the wrapped
    function's for a ``functools.partial``, else its class name.

    Examples:
        >>> reward_name(len)
        'len'
    """
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None) or type(fn).__name__


def is_async(fn: Any) -> bool:
    """True for an ``async def`` function, a ``functools.partial`` of one, or an object whose
    ``__call__`` is ``async def`` (`HTTPReward`): these are awaited, concurrently with each other.

    Examples:
        >>> async def f(prompts, completions, **_): return [1.0] * len(completions)
        >>> is_async(f), is_async(len)
        (True, False)
    """
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(type(fn), "__call__", None))


def resolve_reward(spec: RewardFn | str) -> RewardFn:
    """A reward function from an import path, so configs can name one; a reward model from a path.

    Accepts ``"package.module:function"``, ``"package.module.function"`` or
    ``"path/to/file.py:function"`` (relative to the working directory); callables pass through.
    The command line puts each ``--config`` file's directory on ``sys.path``, so a config beside
    ``task.py`` can say ``task:exact_answer``. An ``nn.Module``, a model directory or a hub id
    (``org/name``) becomes a `RewardModel` (see `looks_like_reward_model`).

    Args:
        spec: a callable, or an import path to one.

    Examples:
        >>> resolve_reward("operator:eq").__name__
        'eq'
    """
    if looks_like_reward_model(spec):  # a module, a model directory or a hub id: see rewards/model.py
        return RewardModel(spec)
    if not isinstance(spec, str):
        return spec
    module_name, sep, attr = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward function {spec!r} is not an import path: write 'package.module:function' "
                         "or 'path/to/file.py:function'")
    try:
        module = _import(module_name)
    except Exception as err:
        raise ImportError(f"cannot import {module_name!r} for reward function {spec!r}: {type(err).__name__}: {err}. "
                          "Check the spelling, install the package, or run from (or put on PYTHONPATH) the directory "
                          "that holds it; a config file's own directory is added automatically") from err
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ImportError(f"{module_name!r} has no reward function {attr!r} (for {spec!r}); "
                          f"its callables are {public[:20]}")
    return getattr(module, attr)


def _import(name: str):
    if name.endswith(".py"):  # a file path: import it under its stem
        if not os.path.exists(name):
            raise FileNotFoundError(f"no file {os.path.abspath(name)!r}")
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(name))[0], name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)
