"""Which implementation runs a call: one forced by name, or the fastest, measured once and cached.

What is asked for, first found: the ``impl`` argument of `fused_logprobs`, the environment
variable ``LIGHTNING_RLPT_LOGPROB_IMPL``, the device's default — ``"auto"`` on CUDA, ``"chunked"``
elsewhere (CPU runs stay bitwise reproducible from run to run, and the CPU choice is measured in
``docs/kernels.md``). ``"auto"`` times every candidate once, on the call's own tensors, the first
time a bucket is seen, and keeps the fastest (as Triton's autotune does). A bucket is (direction,
device, dtypes, bias or not, tokens rounded up to a power of two, H, V, which outputs/gradients
are wanted). The forward and the backward are chosen apart: both read and write the same tensors
(``lse``, entropy), so any forward pairs with any backward.

On CUDA each candidate runs once untimed first (Triton compiles on its first launch). A
candidate that raises while being timed (out of memory, say) is skipped with a warning and
recorded in its `Choice`. Timing noise can make two runs choose differently, and so differ in
the last bits, and each DDP/FSDP rank times on its own: force a name for bitwise reproducible
runs. Under ``torch.use_deterministic_algorithms(True)`` the backwards that add atomically
(``triton``) are no candidates, the flag is part of the bucket, and forcing one raises as torch's
own nondeterministic ops do (a warning with ``warn_only=True``). The first timing of a bucket
holds a lock, so two threads never time it at once.
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from .chunked import compute_dtype
from .implementations import deterministic_backwards, forward_candidates, implementations

ENV = "LIGHTNING_RLPT_LOGPROB_IMPL"
AUTO = "auto"


@dataclass(frozen=True)
class Choice:
    """The outcome of timing one bucket: the winner, each candidate's seconds, and failures."""

    name: str
    seconds: dict[str, float]
    failed: dict[str, str] = field(default_factory=dict)


_CHOICES: dict[tuple, Choice] = {}
_TIMING = threading.RLock()  # re-entrant: a candidate's own call may dispatch again


def check_impl(impl: str, device: torch.device | str, dtype: torch.dtype | None, source: str = "impl") -> str:
    """``impl`` if it is ``"auto"`` or a name usable on ``device`` for ``dtype``, else a ValueError."""
    valid = implementations(device, dtype)
    if impl != AUTO and impl not in valid:
        raise ValueError(
            f"fused_logprobs: {source}={impl!r} is not an implementation usable on {device} for {dtype} inputs. "
            f"Use one of {', '.join(map(repr, valid))}, or 'auto' (time them once per shape, keep the fastest).")
    return impl


def requested(impl: str, device: torch.device, dtype: torch.dtype) -> str:
    """The name or ``"auto"`` a call asks for: the argument (``""`` = none), the variable, the default."""
    if impl:
        return check_impl(impl, device, dtype)
    env = os.environ.get(ENV, "").strip()
    if env:
        return check_impl(env, device, dtype, ENV)
    return AUTO if device.type == "cuda" else "chunked"


def bucket(n: int) -> int:
    """Tokens rounded up to a power of two: 1, 2, 4, 8, ... (0 counts as 1)."""
    return 1 << max(0, n - 1).bit_length()


def _key(direction: str, hidden: Tensor, weight: Tensor, bias: Tensor | None, flags: dict[str, bool]) -> tuple:
    return (direction, str(hidden.device), str(hidden.dtype).removeprefix("torch."),
            str(weight.dtype).removeprefix("torch."), bias is not None, bucket(hidden.shape[0]), hidden.shape[1],
            weight.shape[0], *sorted({**flags, "deterministic": torch.are_deterministic_algorithms_enabled()}.items()))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_candidates(names: tuple[str, ...], call: Callable[[str], Any], device: torch.device) -> tuple[Choice, Any]:
    """Run each named candidate once through ``call`` and return the fastest's result with the `Choice`.

    Args:
        names: the candidates, in order.
        call: runs one candidate by name and returns its result.
        device: where they run (CUDA: one untimed warm-up each, and synchronised timing).

    Raises:
        RuntimeError: every candidate raised (their errors are in the message).
    """
    seconds, failed, best, best_out = {}, {}, None, None
    for name in names:
        try:
            if device.type == "cuda":
                call(name)
            _sync(device)
            start = time.perf_counter()
            out = call(name)
            _sync(device)
        except Exception as err:  # noqa: BLE001 — a candidate that cannot run here is skipped, not fatal
            failed[name] = f"{type(err).__name__}: {err}"[:500]
            warnings.warn(f"fused_logprobs: implementation {name!r} failed while being timed and is skipped: "
                          f"{failed[name]}", RuntimeWarning, stacklevel=2)
            continue
        seconds[name] = time.perf_counter() - start
        if best is None or seconds[name] < seconds[best]:
            best, best_out = name, out
        del out  # only the fastest's outputs stay alive
    if best is None:
        raise RuntimeError(f"fused_logprobs: no implementation could run: {failed}. Force one with impl=<name> "
                           f"(or {ENV}=<name>) to see its full error.")
    return Choice(best, seconds, failed), best_out


def dispatch(direction: str, impl: str, hidden: Tensor, weight: Tensor, bias: Tensor | None,
             flags: dict[str, bool], call: Callable[[str], Any]) -> Any:
    """Run ``call`` with the implementation this call asks for, choosing (and caching) on ``"auto"``.

    Args:
        direction: ``"forward"`` or ``"backward"`` (chosen apart).
        impl: the name asked for by argument, ``"auto"``, or ``""`` (see `requested`).
        hidden, weight, bias: the call's tensors (device, dtypes and shape make the bucket).
        flags: what this call computes (entropy, which gradients): part of the bucket.
        call: runs one implementation by name and returns its result.
    """
    device, dtype = hidden.device, compute_dtype(hidden.dtype, weight.dtype)
    name = requested(impl, device, dtype)
    if name != AUTO:
        if direction == "backward" and not deterministic_backwards((name,)):
            _refuse_if_deterministic(name)
        return call(name)
    key = _key(direction, hidden, weight, bias, flags)
    with _TIMING:
        if key in _CHOICES:
            return call(_CHOICES[key].name)
        names = implementations(device, dtype)
        if direction == "forward":
            names = forward_candidates(names)
        elif torch.are_deterministic_algorithms_enabled():
            names = deterministic_backwards(names)
        choice, out = time_candidates(names, call, device)
        _CHOICES[key] = choice
        return out


def _refuse_if_deterministic(name: str) -> None:
    """A forced atomic backward under deterministic algorithms: torch's own rule for such ops."""
    if not torch.are_deterministic_algorithms_enabled():
        return
    message = (f"fused_logprobs: the {name!r} backward adds into gradients atomically, so its last bits vary run to "
               "run, and torch.use_deterministic_algorithms(True) is on. Use impl='triton_owned' (the same forward, "
               "a backward without atomics) or 'chunked'.")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, UserWarning, stacklevel=3)
    else:
        raise RuntimeError(message)


def choices() -> dict[str, Choice]:
    """Every cached choice, keyed by a readable description of its bucket (for reports).

    Examples:
        >>> clear_choices(); choices()
        {}
    """
    out = {}
    for key, choice in _CHOICES.items():
        direction, device, h_dt, w_dt, has_bias, n, width, vocab, *flags = key
        words = [direction, device, f"{h_dt}/{w_dt}", f"N<={n}", f"H={width}", f"V={vocab}", f"bias={has_bias}"]
        out[" ".join(words + [f"{k}={v}" for k, v in flags])] = choice
    return out


def chosen_implementation(hidden: Tensor, weight: Tensor, bias: Tensor | None = None, *, backward: bool = False,
                          with_entropy: bool = True, need_hidden: bool = True, need_weight: bool = True) -> str | None:
    """The cached automatic choice for tensors like these, or None if that bucket was never timed.

    Args:
        hidden, weight, bias: as passed to `fused_logprobs` (``hidden`` flattened or not).
        backward: ask about the backward's choice instead of the forward's.
        with_entropy: forward: the entropy was computed; backward: it had a gradient.
        need_hidden, need_weight: backward only: which gradients were wanted.
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    flags = _flags(backward, with_entropy, need_hidden, need_weight)
    choice = _CHOICES.get(_key("backward" if backward else "forward", hidden, weight, bias, flags))
    return None if choice is None else choice.name


def _flags(backward: bool, entropy: bool, need_hidden: bool, need_weight: bool) -> dict[str, bool]:
    if not backward:
        return {"entropy": entropy}
    return {"entropy_grad": entropy, "d_hidden": need_hidden, "d_weight": need_weight}


def forward_flags(with_entropy: bool) -> dict[str, bool]:
    return _flags(False, with_entropy, False, False)


def backward_flags(entropy_grad: bool, need_hidden: bool, need_weight: bool) -> dict[str, bool]:
    return _flags(True, entropy_grad, need_hidden, need_weight)


def clear_choices() -> None:
    """Forget every cached choice (the next automatic call of each bucket times again)."""
    _CHOICES.clear()
