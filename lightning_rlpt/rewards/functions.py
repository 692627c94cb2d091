"""Reward functions: TRL's signature ``fn(prompts, completions, **columns) -> list[float]``.

`RewardFunctions` calls each function once per rollout, checks what it returns, weights the
results and counts failures. Per-function scores are logged as ``rewards/<name>/mean`` and
``rewards/<name>/std``; failures scored 0 as ``rewards/<name>/failures``.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
from typing import Any, Callable, Sequence

import torch

from .model import RewardModel, looks_like_reward_model

RewardFn = Callable[..., Sequence[float]]


class RewardError(RuntimeError):
    """A reward function raised or returned something unusable; the message names it."""


def reward_name(fn: RewardFn) -> str:
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None) or type(fn).__name__


def resolve_reward(spec: RewardFn | str) -> RewardFn:
    """A reward function from an import path, so configs can name one; a reward model from a path.

    Accepts ``"package.module:function"``, ``"package.module.function"`` or
    ``"path/to/file.py:function"`` (relative to the working directory); callables pass through.
    The command line puts each ``--config`` file's directory on ``sys.path``, so a config beside
    ``task.py`` can say ``task:exact_answer``. An ``nn.Module``, a model directory or a hub id
    (``org/name``) becomes a `RewardModel` (see `looks_like_reward_model`).

    Example:
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


class RewardFunctions:
    """Several reward functions with weights.

    Args:
        funcs: callables ``fn(prompts, completions, **columns) -> list[float]``, or import
            paths to them (see `resolve_reward`); extra dataset columns arrive as keyword lists
            aligned with ``completions``, plus ``completion_ids``. Accept ``**kwargs`` to ignore
            the ones you do not use. Reward models (a `RewardModel`, a sequence-classification
            ``nn.Module``, a model directory or a hub id) score too; see docs/reward_models.md.
        weights: one weight per function (default all 1).
        on_error: ``"raise"`` stops the run naming the function and the first failing
            sample; ``"zero"`` scores failing samples 0 and counts them.

    Example:
        >>> def exact(prompts, completions, answer, **_): return [float(c == a) for c, a in zip(completions, answer)]
        >>> rf = RewardFunctions([exact])
        >>> rf(["1+1="], ["2"], {"answer": ["2"]})[0].tolist()
        [[1.0]]
    """

    def __init__(self, funcs: Sequence[RewardFn] | RewardFn, weights: Sequence[float] | None = None,
                 on_error: str = "raise"):
        funcs = [funcs] if callable(funcs) or isinstance(funcs, str) else list(funcs)
        funcs = [resolve_reward(fn) for fn in funcs]
        if not funcs:
            raise ValueError("reward_funcs is empty: pass at least one fn(prompts, completions, **columns) -> list[float]")
        for fn in funcs:
            if not callable(fn):
                raise TypeError(f"reward function {fn!r} is not callable; pass a function fn(prompts, completions, **columns)")
        if weights is not None and len(weights) != len(funcs):
            raise ValueError(f"got {len(weights)} reward_weights for {len(funcs)} reward_funcs; give one weight per function")
        if on_error not in ("raise", "zero"):
            raise ValueError(f"on_error must be 'raise' or 'zero' (got {on_error!r})")
        self.funcs = funcs
        self.weights = torch.tensor(list(weights) if weights is not None else [1.0] * len(funcs))
        self.on_error = on_error
        self.names = self._unique_names(funcs)

    @staticmethod
    def _unique_names(funcs: Sequence[RewardFn]) -> list[str]:
        names: list[str] = []
        for fn in funcs:
            base = reward_name(fn)
            name, k = base, 1
            while name in names:
                name, k = f"{base}_{k}", k + 1
            names.append(name)
        return names

    def __call__(self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]],
                 **extra: Any) -> tuple[torch.Tensor, dict[str, int]]:
        """Scores ``[N, F]`` and failures per function name."""
        scores, failures = [], {}
        for fn, name in zip(self.funcs, self.names):
            values, failed = self._score(fn, name, prompts, completions, {**columns, **extra})
            scores.append(values)
            failures[name] = failed
        return torch.stack(scores, dim=1), failures

    def to(self, device: torch.device | str) -> "RewardFunctions":
        """Move the reward models among the functions to ``device`` (the module calls it in ``configure_model``)."""
        for fn in self.funcs:
            if isinstance(fn, RewardModel):
                fn.to(device)
        return self

    def combine(self, scores: torch.Tensor) -> torch.Tensor:
        return scores @ self.weights.to(scores)

    def _score(self, fn, name, prompts, completions, kwargs) -> tuple[torch.Tensor, int]:
        try:
            values = self._check(name, fn(prompts=prompts, completions=completions, **kwargs), len(completions))
            return values, 0
        except RewardError:
            raise
        except Exception as err:  # find which sample breaks it, then raise or score it 0
            return self._score_one_by_one(fn, name, prompts, completions, kwargs, err)

    def _score_one_by_one(self, fn, name, prompts, completions, kwargs, batch_err):
        values, failed = [], 0
        for i in range(len(completions)):
            one = {k: v[i:i + 1] if isinstance(v, (list, torch.Tensor)) else v for k, v in kwargs.items()}
            try:
                values.append(float(self._check(name, fn(prompts=prompts[i:i + 1], completions=completions[i:i + 1], **one), 1)[0]))
            except Exception as err:
                if self.on_error == "raise":
                    raise RewardError(
                        f"reward function {name!r} raised {type(err).__name__}: {err} on sample {i} "
                        f"(prompt {prompts[i]!r}, completion {completions[i]!r}). Fix the function, or pass "
                        f"reward_on_error='zero' to score such samples 0 and count them in rewards/{name}/failures"
                    ) from err
                values.append(0.0)
                failed += 1
        if failed == 0:  # fails on the batch but not on single samples: report the batch error
            raise RewardError(f"reward function {name!r} raised {type(batch_err).__name__}: {batch_err} "
                              f"on a batch of {len(completions)} completions") from batch_err
        return torch.tensor(values), failed

    def _check(self, name: str, values: Any, n: int) -> torch.Tensor:
        try:
            values = [float("nan") if v is None else float(v) for v in values]
        except (TypeError, ValueError) as err:
            raise RewardError(f"reward function {name!r} must return a list of numbers, got {values!r:.200}") from err
        if len(values) != n:
            raise RewardError(f"reward function {name!r} returned {len(values)} values for {n} completions; "
                              f"return exactly one float per completion")
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            raise RewardError(f"reward function {name!r} returned a non-finite value ({values[bad[0]]}) for sample "
                              f"{bad[0]} ({len(bad)} such samples); return finite floats (e.g. 0.0 for a failure)")
        return torch.tensor(values, dtype=torch.float32)
