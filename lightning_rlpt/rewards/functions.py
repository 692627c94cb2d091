"""Reward functions: TRL's signature ``fn(prompts, completions, **kwargs) -> list[float | None]``.

`RewardFunctions` calls each function once per rollout, checks what it returns, weights the
results and counts failures, with TRL's semantics (see docs/rewards.md):

- ``async def`` functions (and `HTTPReward`) run concurrently with each other, each on a fresh
  event loop in a daemon thread, started before the sync ones so their waiting overlaps the sync
  functions' work; sync functions run one after another, as in TRL.
- A function returns one value per completion; ``None`` means "does not apply to this sample"
  (multi-task rewards). It is NaN in ``rewards_per_func``, left out of the weighted sum (TRL's
  ``nansum``) and of ``rewards/<name>/mean``/``std``, and counted in ``rewards/<name>/none_frac``.
  A sample for which *every* function returns None is an error (TRL 1.16 warns and gives it
  advantage 0): nothing scored it, so the run stops and names it.
- ``timeout`` (``RLModule(reward_timeout=...)``) bounds every call; a call that overruns, or a
  reward service that stays down, is handled per ``on_error`` for every sample of the call.
- ``aggregation`` (TRL's ``multi_objective_aggregation``) says what advantages are computed
  from: the weighted sum (``sum_then_normalize``) or GDPO's sum of per-group normalised scores
  (``normalize_then_sum``, `RewardFunctions.aggregate`).
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import torch

from .calling import RewardError, RewardTimeout, RewardUnavailable, call_async, call_sync, in_background
from .model import RewardModel
from .resolve import RewardFn, is_async, resolve_reward, reward_name

AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
GDPO_EPS = 1e-4  # TRL's: added to each function's group std

__all__ = ["AGGREGATIONS", "RewardError", "RewardFunctions", "RewardTimeout", "RewardUnavailable", "as_trl_completions",
           "resolve_reward", "reward_name"]


def as_trl_completions(prompts: Sequence[Any], texts: Sequence[str]) -> list[Any]:
    """Completions as TRL hands them to reward functions: ``[{"role": "assistant", "content": text}]``
    when the prompts are conversational (lists of messages), the decoded strings otherwise.

    Examples:
        >>> as_trl_completions([[{"role": "user", "content": "1+1?"}]], ["2"])
        [[{'role': 'assistant', 'content': '2'}]]
    """
    conversational = bool(prompts) and isinstance(prompts[0], list) and all(isinstance(m, dict) for m in prompts[0])
    return [[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts)


class RewardFunctions:
    """Several reward functions with weights.

    Args:
        funcs: callables ``fn(prompts, completions, **kwargs) -> list[float | None]`` (sync or
            ``async def``), or import paths to them (see `resolve_reward`). Keyword arguments are
            TRL's: ``completion_ids``, ``trainer_state`` and every dataset column, as lists aligned
            with ``completions``. Accept ``**kwargs`` to ignore the ones you do not use. Reward
            models (a `RewardModel`, a sequence-classification ``nn.Module``, a model directory or
            a hub id) score too; see docs/reward_models.md.
        weights: one weight per function (default all 1).
        on_error: ``"raise"`` stops the run naming the function and the first failing sample (or
            the timeout); ``"zero"`` scores failing samples 0 and counts them in
            ``rewards/<name>/failures`` (a call that times out or whose service is down: all its
            samples). Returning wrong counts, non-numbers, NaN or inf is always an error.
        timeout: seconds each call of a function may take, or None (the default, as TRL: no
            limit; sync functions then run in the caller's thread, where ``math_verify``'s own
            ``signal.alarm`` timeouts work). With a limit, sync functions run in a daemon thread
            that is abandoned, still running, when it overruns; coroutines are cancelled. A batch
            call that raises is retried sample by sample to name the failing one, each retry
            under the same limit.
        aggregation: ``"sum_then_normalize"`` (TRL's default): advantages come from the weighted
            sum of the scores; ``"normalize_then_sum"`` ("GDPO: Group reward-Decoupled
            Normalization Policy Optimization for Multi-reward RL Optimization", arXiv
            2601.05242): from the weighted sum of each function's scores normalised within each
            group (`aggregate`), so a reward with a wide range cannot drown the others.

    Examples:
        >>> def exact(prompts, completions, answer, **_): return [float(c == a) for c, a in zip(completions, answer)]
        >>> rf = RewardFunctions([exact])
        >>> rf(["1+1="], ["2"], {"answer": ["2"]})[0].tolist()
        [[1.0]]
    """

    def __init__(self, funcs: Sequence[RewardFn] | RewardFn, weights: Sequence[float] | None = None,
                 on_error: str = "raise", timeout: float | None = None, aggregation: str = "sum_then_normalize"):
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
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"multi_objective_aggregation must be one of {list(AGGREGATIONS)} (got {aggregation!r}): "
                             "'normalize_then_sum' normalises each reward function within its group before the "
                             "weighted sum (GDPO)")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"reward_timeout must be > 0 seconds, or None for no limit (got {timeout!r})")
        self.funcs = funcs
        self.weights = torch.tensor(list(weights) if weights is not None else [1.0] * len(funcs))
        self.on_error, self.timeout, self.aggregation = on_error, timeout, aggregation
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

    def __call__(self, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]],
                 **extra: Any) -> tuple[torch.Tensor, dict[str, int]]:
        """Scores ``[N, F]`` (NaN where a function returned None) and failures per function name."""
        kwargs = {**columns, **extra}
        jobs = {j: in_background(lambda fn=fn, name=name: self._score(fn, name, prompts, completions, kwargs))
                for j, (fn, name) in enumerate(zip(self.funcs, self.names)) if is_async(fn)}
        results = [None if j in jobs else self._score(fn, name, prompts, completions, kwargs)
                   for j, (fn, name) in enumerate(zip(self.funcs, self.names))]
        for j, job in jobs.items():  # each call inside is bounded by the timeout (when set): so is this wait
            results[j] = job.result()
        scores = torch.stack([values for values, _ in results], dim=1)
        self._check_some_apply(scores, prompts, completions)
        return scores, {name: failed for name, (_, failed) in zip(self.names, results)}

    def call_counts(self) -> dict[str, float]:
        """Counts a reward object keeps of its last call (a ``counts`` dict with the same keys at
        every call, e.g. `CodeExecutionReward`'s ``load_errors``), as ``rewards/<name>/<key>``:
        the module logs them summed over ranks, beside ``failures``."""
        return {f"rewards/{name}/{key}": float(value) for fn, name in zip(self.funcs, self.names)
                for key, value in (getattr(fn, "counts", None) or {}).items()}

    def to(self, device: torch.device | str) -> "RewardFunctions":
        """Move the reward models among the functions to ``device`` (the module calls it in ``configure_model``)."""
        for fn in self.funcs:
            if isinstance(fn, RewardModel):
                fn.to(device)
        return self

    def combine(self, scores: torch.Tensor) -> torch.Tensor:
        """The weighted sum over functions, skipping None (NaN) entries as TRL's ``nansum`` does."""
        return torch.nansum(scores * self.weights.to(scores), dim=1)

    def aggregate(self, scores: torch.Tensor, group_size: int) -> torch.Tensor:
        """``[N]``: the rewards advantages are computed from, per ``aggregation``.

        ``normalize_then_sum`` is TRL's (``GRPOTrainer._generate_and_score_completions``): each
        function's scores ``x`` in a group become ``(x - nanmean) / (nanstd + 1e-4)`` (Bessel's
        std over the samples it applies to; a sample it returned None for stays out, as does a
        function that applies to one sample only, whose std is undefined; with ``group_size`` 1,
        0), then the weighted sum skips None as `combine` does. The sum's group mean is then 0:
        TRL's last step, a batch-wide normalisation, is the advantage estimator's (GDPO uses
        the batch std: ``advantage="grpo_batch_std"``).

        Args:
            scores: ``[N, F]`` (NaN for None), rows in groups of ``group_size`` consecutive rows.
            group_size: completions per prompt.
        """
        if self.aggregation == "sum_then_normalize":
            return self.combine(scores)
        grouped = scores.view(-1, group_size, scores.shape[1])
        mean = torch.nanmean(grouped, dim=1, keepdim=True)
        if group_size > 1:
            count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
            var = torch.nanmean((grouped - mean) ** 2, dim=1, keepdim=True) * count / (count - 1)
            std = torch.where(count > 1, var.sqrt(), torch.full_like(var, float("nan")))
        else:
            std = torch.zeros_like(mean)
        return self.combine(((grouped - mean) / (std + GDPO_EPS)).view_as(scores))

    # ---------------------------------------------------------------- one function
    def _call(self, fn: RewardFn, kwargs: dict[str, Any]) -> Any:
        return (call_async if is_async(fn) else call_sync)(fn, kwargs, self.timeout)

    def _score(self, fn, name, prompts, completions, kwargs) -> tuple[torch.Tensor, int]:
        n = len(completions)
        try:
            return self._check(name, self._call(fn, dict(prompts=prompts, completions=completions, **kwargs)), n), 0
        except RewardUnavailable as err:  # a timeout or a service that is down: per sample would not help
            return self._unavailable(name, err, n)
        except RewardError:
            raise
        except Exception as err:  # find which sample breaks it, then raise or score it 0
            return self._score_one_by_one(fn, name, prompts, completions, kwargs, err)

    def _unavailable(self, name: str, err: RewardUnavailable, n: int) -> tuple[torch.Tensor, int]:
        what = f"reward function {name!r} failed on a batch of {n} completions: {err}"
        if self.on_error == "raise":
            fix = "Raise reward_timeout or make the function faster, or pass" if isinstance(err, RewardTimeout) else "Or pass"
            raise RewardError(f"{what}. {fix} reward_on_error='zero' to score such calls 0 and count them in "
                              f"rewards/{name}/failures") from err
        warnings.warn(f"{what}; all {n} scored 0 and counted in rewards/{name}/failures", stacklevel=2)
        return torch.zeros(n), n

    def _score_one_by_one(self, fn, name, prompts, completions, kwargs, batch_err):
        values, failed = [], 0
        for i in range(len(completions)):
            one = {k: v[i:i + 1] if isinstance(v, (list, torch.Tensor)) else v for k, v in kwargs.items()}
            try:
                out = self._call(fn, dict(prompts=prompts[i:i + 1], completions=completions[i:i + 1], **one))
            except Exception as err:
                if self.on_error == "raise":
                    raise RewardError(
                        f"reward function {name!r} raised {type(err).__name__}: {err} on sample {i} "
                        f"(prompt {_short(prompts[i])}, completion {_short(completions[i])}). Fix the function, or pass "
                        f"reward_on_error='zero' to score such samples 0 and count them in rewards/{name}/failures"
                    ) from err
                values.append(0.0)
                failed += 1
                continue
            # Outside the try: an unusable return is the function's bug, never a sample scored 0.
            values.append(float(self._check(name, out, 1, first=i)[0]))
        if failed == 0:  # fails on the batch but not on single samples: report the batch error
            raise RewardError(f"reward function {name!r} raised {type(batch_err).__name__}: {batch_err} "
                              f"on a batch of {len(completions)} completions") from batch_err
        return torch.tensor(values), failed

    # ---------------------------------------------------------------- checks
    @staticmethod
    def _check(name: str, values: Any, n: int, first: int = 0) -> torch.Tensor:
        """One float per completion, NaN for None; anything else unusable is a `RewardError`, raised
        once for the call whatever ``on_error`` says (it is the function's bug, not a sample's).
        ``first``: the batch index of ``values[0]`` (a call retried sample by sample), for messages."""
        items = _as_sequence(name, values)
        if len(items) != n:
            raise RewardError(f"reward function {name!r} returned {len(items)} values for {n} completions; "
                              f"return exactly one float per completion")
        floats = [_as_float(name, first + i, v) for i, v in enumerate(items)]
        bad = [first + i for i, v in enumerate(floats) if v is not None and not math.isfinite(v)]
        if bad:
            raise RewardError(f"reward function {name!r} returned a non-finite value ({floats[bad[0] - first]}) for sample "
                              f"{bad[0]} ({len(bad)} such samples); return finite floats (e.g. 0.0 for a failure), "
                              "or None where the reward does not apply to a sample")
        return torch.tensor([math.nan if v is None else v for v in floats], dtype=torch.float32)

    def _check_some_apply(self, scores: torch.Tensor, prompts: list[Any], completions: list[Any]) -> None:
        """TRL warns when every function returned None for a sample; here it is an error."""
        unscored = torch.isnan(scores).all(dim=1).nonzero().flatten().tolist()
        if unscored:
            i = unscored[0]
            raise RewardError(
                f"every reward function ({', '.join(self.names)}) returned None for sample {i} (prompt {_short(prompts[i])}, "
                f"completion {_short(completions[i])}; {len(unscored)} such samples): nothing scored it. Make one "
                "function score every kind of sample (a fallback reward), or leave such prompts out of the dataset")


def _as_sequence(name: str, values: Any) -> list[Any]:
    """The returned values as a list, if they are an ordered sequence (a list, a tuple, a 1-d
    tensor or array). A dict would give its keys and a set its own order, and a generator cannot
    be counted before it is consumed: all are refused rather than read."""
    ordered = isinstance(values, Sequence) and not isinstance(values, (str, bytes))
    array = getattr(values, "ndim", None) == 1 and hasattr(values, "tolist")  # torch.Tensor, numpy.ndarray
    if not (ordered or array):
        what = {dict: "a dict (its keys would become the scores)", set: "a set (whose order is not the completions')",
                frozenset: "a set (whose order is not the completions')"}.get(type(values), _kind(values))
        raise RewardError(f"reward function {name!r} must return a list of numbers (None where it does not apply), "
                          f"one per completion in order; it returned {what}: {_short(values, 200)}. Return a list, e.g. "
                          "[float(v) for v in scores]")
    return values.tolist() if array else list(values)


def _as_float(name: str, i: int, value: Any) -> float | None:
    """``value`` as a float (None stays None); a string, a non-number or a number too large for a
    float (``10**400``: ``float()`` raises OverflowError) is a `RewardError` naming the sample."""
    if value is None:
        return None
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError("strings are not rewards")
        return float(value)
    except OverflowError as err:
        size = int(value.bit_length() * math.log10(2)) + 1 if isinstance(value, int) else None
        digits = f" (an integer of about {size} digits)" if size else ""
        raise RewardError(f"reward function {name!r} returned a number too large for a float{digits} for sample {i}; "
                          "return finite floats (clip or rescale the score)") from err
    except (TypeError, ValueError) as err:
        raise RewardError(f"reward function {name!r} must return a list of numbers (None where it does not apply), "
                          f"got {_kind(value)} {_short(value)} for sample {i}") from err


def _kind(value: Any) -> str:
    """``a generator``, ``a str``...: the type named for an error message."""
    article = "an" if type(value).__name__[:1].lower() in "aeiou" else "a"
    return f"{article} {type(value).__name__}"


def _short(value: Any, limit: int = 120) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300-digit str limit, or inside a container
        return f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[:limit] + "...'"
