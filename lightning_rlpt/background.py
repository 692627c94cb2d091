"""`in_background`: a call on a daemon thread of its own, its outcome in a future. Shared by the
reward calls (`rewards.calling`) and the tool calls of episodes (`rollout.episodes.tools`), which
both may run user code that never returns."""
from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any, Callable


def in_background(fn: Callable[[], Any], name: str = "lightning-rlpt-background") -> cf.Future:
    """Start ``fn()`` in a new daemon thread; its result or exception lands in the returned future.

    A daemon thread, not a thread pool: a call that never returns must not keep the process
    alive at exit, nor hold a pool slot.

    Examples:
        >>> in_background(lambda: 6 * 7).result()
        42
    """
    future: cf.Future = cf.Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(err)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
