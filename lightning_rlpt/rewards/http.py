"""`HTTPReward`: a reward computed by a service, posted JSON over HTTP (stdlib ``urllib`` only).

The protocol (see docs/rewards.md): ``POST <url>`` with ``Content-Type: application/json`` and
the body::

    {"prompts": [...], "completions": [...], "completion_ids": [[...], ...],
     "<column>": [...], ..., "trainer_state": {"global_step": 3, ...}}

one entry per completion in every list (a batch of at most ``batch_size``), answered by
``200`` with ``{"rewards": [number or null, ...]}`` in the same order; ``null`` means "does not
apply to this sample", as a Python reward's None.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import math
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

from .calling import RewardError, RewardUnavailable, in_thread

RETRY_STATUS = (408, 429, 500, 502, 503, 504)  # worth another try; any other non-200 is the request's fault
STATE_FIELDS = ("global_step", "epoch", "max_steps", "num_train_epochs")


class HTTPReward:
    """A remote reward: posts each batch of prompts, completions and columns as JSON, reads the
    scores back. An ``async`` callable, so it runs concurrently with other async rewards, and its
    batches run concurrently with each other (at most ``max_concurrency`` at once).

    Connection errors, timeouts and the statuses 408/429/5xx are retried ``retries`` times, after
    ``backoff × 2^attempt`` seconds; if every attempt fails the call raises `RewardUnavailable`,
    which ``RLModule(reward_on_error=...)`` turns into an error or into zeros counted in
    ``rewards/<name>/failures``. An answer that is not the protocol's (bad JSON, a wrong count,
    non-numbers, another 4xx) is a bug, not bad luck: a `RewardError` naming the URL and what came
    back, never retried.

    Args:
        url: ``http://`` or ``https://`` address that answers POSTs.
        timeout: seconds allowed to connect and for each read of one request (``urllib``'s socket
            timeout); ``RLModule(reward_timeout=...)`` bounds the whole call on top.
        retries: further attempts after a failed one (0: one attempt).
        backoff: seconds before the first retry, doubled before each next one.
        batch_size: completions per request; None sends all in one.
        max_concurrency: requests in flight at once.
        columns: dataset columns to send; None sends every column (each must be JSON-serialisable).
        headers: extra HTTP headers (e.g. ``{"Authorization": "Bearer ..."}``).
        name: logged as ``rewards/<name>/...``.

    Example:
        >>> reward = HTTPReward("http://127.0.0.1:8000/score", timeout=10, retries=2, batch_size=32)
        >>> module = RLModule(model, reward_funcs=[reward])  # doctest: +SKIP
    """

    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 2, backoff: float = 0.5,
                 batch_size: int | None = None, max_concurrency: int = 8, columns: Sequence[str] | None = None,
                 headers: dict[str, str] | None = None, name: str = "http"):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"HTTPReward url must start with http:// or https:// (got {url!r})")
        if not timeout > 0 or retries < 0 or backoff < 0:
            raise ValueError(f"HTTPReward needs timeout > 0, retries >= 0, backoff >= 0 (got timeout={timeout}, "
                             f"retries={retries}, backoff={backoff})")
        if (batch_size is not None and batch_size < 1) or max_concurrency < 1:
            raise ValueError(f"HTTPReward needs batch_size >= 1 or None and max_concurrency >= 1 "
                             f"(got batch_size={batch_size}, max_concurrency={max_concurrency})")
        self.url, self.timeout, self.retries, self.backoff = url, float(timeout), int(retries), float(backoff)
        self.batch_size, self.max_concurrency = batch_size, max_concurrency
        self.columns = None if columns is None else list(columns)
        self.headers = dict(headers or {})
        self.__name__ = name

    def __repr__(self) -> str:
        return f"HTTPReward({self.url!r}, name={self.__name__!r})"

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        fields = {"prompts": list(prompts), "completions": list(completions), **self._fields(kwargs, n)}
        size = self.batch_size or max(n, 1)
        bodies = [self._encode({k: v[i:i + size] for k, v in fields.items()}, kwargs.get("trainer_state"))
                  for i in range(0, n, size)]
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(body: bytes, count: int) -> list[float | None]:
            async with gate:
                return await in_thread(lambda: self._post(body, count))

        parts = await asyncio.gather(*(one(b, min(size, n - i * size)) for i, b in enumerate(bodies)))
        return [v for part in parts for v in part]

    # ---------------------------------------------------------------- request
    def _fields(self, kwargs: dict[str, Any], n: int) -> dict[str, list]:
        """The per-completion lists to send: ``completion_ids`` and the chosen columns."""
        names = [k for k in kwargs if k != "trainer_state"] if self.columns is None else ["completion_ids", *self.columns]
        missing = [k for k in names if k not in kwargs and k != "completion_ids"]
        if missing:
            raise RewardError(f"HTTPReward {self.url}: columns {missing} are not in the batch, which has "
                              f"{sorted(kwargs)}; fix HTTPReward(columns=...)")
        out = {}
        for k in names:
            if k in kwargs and not callable(kwargs[k]):
                values = list(kwargs[k])
                if len(values) != n:
                    raise RewardError(f"HTTPReward {self.url}: {k!r} has {len(values)} values for {n} completions")
                out[k] = values
        return out

    def _encode(self, fields: dict[str, list], state: Any) -> bytes:
        if state is not None:
            fields = {**fields, "trainer_state": {f: getattr(state, f) for f in STATE_FIELDS if hasattr(state, f)}}
        try:
            return json.dumps(fields, allow_nan=False).encode()
        except (TypeError, ValueError) as err:
            bad = next((k for k, v in fields.items() if not _encodable(v)), "?")
            raise RewardError(f"HTTPReward {self.url}: field {bad!r} cannot be sent as JSON ({err}); convert the column "
                              "to plain numbers/strings, or pass HTTPReward(columns=[...]) with the ones the service "
                              "reads") from err

    def _post(self, body: bytes, count: int) -> list[float | None]:
        """One request with retries: the parsed scores, or `RewardUnavailable` after the last attempt."""
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, text = self._send(body)
            except (urllib.error.URLError, http.client.HTTPException, socket.timeout, ConnectionError, OSError) as err:
                reason = getattr(err, "reason", err)
                last = f"{type(reason).__name__}: {reason}"
                continue
            if status == 200:
                return self._parse(text, count)
            if status not in RETRY_STATUS:
                raise RewardError(f"HTTPReward {self.url} answered HTTP {status}: {text[:300]!r}; the request was "
                                  "refused, so retrying would not help (check the URL and the service's protocol)")
            last = f"HTTP {status}: {text[:200]!r}"
        raise RewardUnavailable(f"reward service {self.url} failed {self.retries + 1} attempt(s) (timeout "
                                f"{self.timeout:g} s each); last: {last}. Check that it is running and reachable, or "
                                "raise HTTPReward(timeout=..., retries=...)")

    def _send(self, body: bytes) -> tuple[int, str]:
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as err:  # a non-2xx answer: read it, the caller decides
            return err.code, err.read().decode("utf-8", "replace")

    # ---------------------------------------------------------------- response
    def _parse(self, text: str, count: int) -> list[float | None]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise RewardError(f"HTTPReward {self.url} answered invalid JSON ({err}): {text[:300]!r}; "
                              'it must answer {"rewards": [number or null, ...]}') from err
        rewards = data.get("rewards") if isinstance(data, dict) else None
        if not isinstance(rewards, list):
            raise RewardError(f'HTTPReward {self.url} answered {text[:300]!r}, without a "rewards" list; '
                              'it must answer {"rewards": [number or null, ...]}, one per completion')
        if len(rewards) != count:
            raise RewardError(f"HTTPReward {self.url} returned {len(rewards)} rewards for {count} completions: "
                              f"{text[:300]!r}; the service must answer one reward per completion, in order")
        for i, v in enumerate(rewards):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise RewardError(f"HTTPReward {self.url} returned {v!r} for completion {i} of {count}: rewards must "
                                  "be finite numbers, or null where the reward does not apply")
        return [None if v is None else float(v) for v in rewards]


def _encodable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False

