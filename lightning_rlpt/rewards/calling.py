"""How one reward call runs: in the caller's thread, in a daemon thread under a time limit, or
as a coroutine on a fresh event loop; and the errors a call can end in.

A Python thread cannot be killed. A sync reward that overruns ``reward_timeout`` is therefore
*abandoned*: its daemon thread keeps running until the function returns by itself (or the
process exits), and its result, if any, is dropped. A coroutine that overruns is cancelled at
its next ``await``; one that blocks its loop without awaiting is abandoned like a sync function.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
from functools import partial
from typing import Any, Callable

from .. import background

in_background = partial(background.in_background, name="lightning-rlpt-reward")  # reward threads, named as such


class RewardError(RuntimeError):
    """A reward function raised or returned something unusable; the message names it."""


class RewardUnavailable(RewardError):
    """A whole call failed in a way that calling sample by sample would not fix (a reward
    service that is down or keeps failing): every sample of the call is handled per
    ``reward_on_error``."""


class RewardTimeout(RewardUnavailable):
    """A call gave no result within ``reward_timeout`` seconds.

    Args:
        timeout: the limit, in seconds.
    """

    def __init__(self, timeout: float):
        super().__init__(f"gave no result within reward_timeout={timeout:g} s (the call was abandoned; a sync "
                         "function keeps running in its daemon thread until it returns)")
        self.timeout = timeout


def wait(future: cf.Future, timeout: float | None) -> Any:
    """The future's result, or `RewardTimeout` when it has none after ``timeout`` seconds.

    ``cf.wait`` (not ``future.result(timeout)``) so that a ``TimeoutError`` raised *by the
    function* stays the function's error and is not mistaken for the time limit.
    """
    done, _ = cf.wait([future], timeout=timeout)
    if not done:
        raise RewardTimeout(timeout)
    return future.result()


def call_sync(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """``fn(**kwargs)``: in the caller's thread without a time limit (so libraries that time
    themselves out with ``signal.alarm``, such as ``math_verify``, keep working), else in a
    daemon thread that is abandoned after ``timeout`` seconds.

    Args:
        fn: a sync reward function.
        kwargs: its keyword arguments.
        timeout: seconds, or None for no limit.

    Examples:
        >>> call_sync(lambda completions: [len(c) for c in completions], {"completions": ["ab"]}, 1.0)
        [2]
    """
    if timeout is None:
        return fn(**kwargs)
    return wait(in_background(lambda: fn(**kwargs)), timeout)


def call_async(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """``await fn(**kwargs)`` on a fresh event loop in a daemon thread, under ``timeout``.

    A fresh loop in its own thread works whatever the caller's thread runs: inside Jupyter or
    any other running loop, ``asyncio.run`` would refuse. The coroutine is cancelled at the
    limit; if it blocks its loop (sync I/O inside ``async def``), the thread is abandoned at the
    same limit.

    Args:
        fn: an ``async def`` reward function (or an object with an ``async def __call__``).
        kwargs: its keyword arguments.
        timeout: seconds, or None for no limit.

    Examples:
        >>> async def double(xs): return [2 * x for x in xs]
        >>> call_async(double, {"xs": [1, 2]}, 1.0)
        [2, 4]
    """
    return wait(in_background(lambda: run_coroutine(lambda: fn(**kwargs), timeout)), timeout)


def run_coroutine(make: Callable[[], Any], timeout: float | None) -> Any:
    """Run the coroutine ``make()`` on a new event loop in this thread, cancelled after ``timeout``.

    Unlike ``asyncio.run`` the loop is closed without waiting for its default executor, so an
    ``asyncio.to_thread`` call that outlives the limit cannot hold the caller past it.
    """
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(make())
        done, _ = loop.run_until_complete(asyncio.wait({task}, timeout=timeout))
        if not done:
            raise RewardTimeout(timeout)
        return task.result()
    finally:
        _cancel_all(loop)
        loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Await blocking ``fn()`` run in a daemon thread (for blocking I/O inside a coroutine, e.g.
    `HTTPReward`'s requests). Cancelling the await abandons the thread, which ends by itself.

    Examples:
        >>> asyncio.run(in_thread(lambda: 42))
        42
    """
    return await asyncio.wrap_future(in_background(fn))
