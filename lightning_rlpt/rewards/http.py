"""`HTTPReward`: a reward computed by a service, posted JSON over HTTP (`lightning_rlpt.http_client`).

The protocol (see docs/rewards.md): ``POST <url>`` with ``Content-Type: application/json`` and
the body::

    {"prompts": [...], "completions": [...], "completion_ids": [[...], ...],
     "<column>": [...], ..., "trainer_state": {"global_step": 3, ...}}

one entry per completion in every list (a batch of at most ``batch_size``), answered by
``200`` with ``{"rewards": [number or null, ...]}`` in the same order; ``null`` means "does not
apply to this sample", as a Python reward's None.

The service is outside the trainer's trust boundary, so what comes back is bounded before it is
believed: redirects are refused unless asked for (and never carry the headers to another
origin), the answer is read up to a size cap, and an answer Python cannot turn into floats (an
integer like ``10**400``, JSON nested 100,000 deep) is a `RewardError` for the whole batch.
`post_json` and `read_json` are that boundary, for any client of a JSON service.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.parse
from typing import Any, Sequence

from ..http_client import HTTPFailure, exchange
from .calling import RewardError, RewardUnavailable, in_thread

RETRY_STATUS = (408, 429, 500, 502, 503, 504)  # worth another try; any other non-200 is the request's fault
STATE_FIELDS = ("global_step", "epoch", "max_steps", "num_train_epochs")
REDIRECT_STATUS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
DEFAULT_MAX_RESPONSE_BYTES = 4 * 2**20  # ~150,000 rewards: room for a service that adds details


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
        timeout: seconds one request may take, connecting and reading included (a service that
            drips bytes is cut off); ``RLModule(reward_timeout=...)`` bounds the whole call on top.
        retries: further attempts after a failed one (0: one attempt).
        backoff: seconds before the first retry, doubled before each next one.
        batch_size: completions per request; None sends all in one.
        max_concurrency: requests in flight at once.
        columns: dataset columns to send; None sends every column (each must be JSON-serialisable).
        headers: extra HTTP headers (e.g. ``{"Authorization": "Bearer ..."}``). They are sent to
            ``url``'s origin only: a followed redirect to another scheme, host or port drops all
            of them (any may be a credential: ``Authorization``, ``X-Api-Key``, cookies).
        name: logged as ``rewards/<name>/...``.
        follow_redirects: False (default): a 3xx answer is a `RewardError` naming the
            ``Location`` (point ``url`` at the final address). True: follow at most 5 redirects
            that keep the POST and its body (307, 308), without ``headers`` once the origin
            changes and never from https to http; 301/302/303 stay refused, because they turn
            the POST into a GET that no longer carries the batch.
        max_response_bytes: the most bytes of an answer read (default 4 MiB, about 150,000
            rewards); a longer one is a `RewardError`, never retried.

    Examples:
        >>> reward = HTTPReward("http://127.0.0.1:8000/score", timeout=10, retries=2, batch_size=32)
        >>> module = RLModule(model, reward_funcs=[reward])  # doctest: +SKIP
    """

    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 2, backoff: float = 0.5,
                 batch_size: int | None = None, max_concurrency: int = 8, columns: Sequence[str] | None = None,
                 headers: dict[str, str] | None = None, name: str = "http", follow_redirects: bool = False,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"HTTPReward url must start with http:// or https:// (got {url!r})")
        if not timeout > 0 or retries < 0 or backoff < 0:
            raise ValueError(f"HTTPReward needs timeout > 0, retries >= 0, backoff >= 0 (got timeout={timeout}, "
                             f"retries={retries}, backoff={backoff})")
        if (batch_size is not None and batch_size < 1) or max_concurrency < 1:
            raise ValueError(f"HTTPReward needs batch_size >= 1 or None and max_concurrency >= 1 "
                             f"(got batch_size={batch_size}, max_concurrency={max_concurrency})")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int) or max_response_bytes < 1:
            raise ValueError(f"HTTPReward max_response_bytes must be an int >= 1 (got {max_response_bytes!r})")
        self.url, self.timeout, self.retries, self.backoff = url, float(timeout), int(retries), float(backoff)
        self.batch_size, self.max_concurrency = batch_size, max_concurrency
        self.columns = None if columns is None else list(columns)
        self.headers = dict(headers or {})
        self.follow_redirects, self.max_response_bytes = bool(follow_redirects), max_response_bytes
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
                status, text = post_json(self.url, body, self.headers, timeout=self.timeout,
                                         max_response_bytes=self.max_response_bytes,
                                         follow_redirects=self.follow_redirects, who=f"HTTPReward {self.url}")
            except HTTPFailure as err:  # no answer, or a torn one
                last = str(err)
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

    # ---------------------------------------------------------------- response
    def _parse(self, text: str, count: int) -> list[float | None]:
        data = read_json(text, f"HTTPReward {self.url}", 'it must answer {"rewards": [number or null, ...]}')
        rewards = data.get("rewards") if isinstance(data, dict) else None
        if not isinstance(rewards, list):
            raise RewardError(f'HTTPReward {self.url} answered {text[:300]!r}, without a "rewards" list; '
                              'it must answer {"rewards": [number or null, ...]}, one per completion')
        if len(rewards) != count:
            raise RewardError(f"HTTPReward {self.url} returned {len(rewards)} rewards for {count} completions: "
                              f"{text[:300]!r}; the service must answer one reward per completion, in order")
        for i, v in enumerate(rewards):
            if v is not None and not _finite_number(v):
                raise RewardError(f"HTTPReward {self.url} returned {_preview(v)} for completion {i} of {count}: "
                                  "rewards must be finite numbers, or null where the reward does not apply "
                                  "(a float holds at most about 1.8e308)")
        return [None if v is None else float(v) for v in rewards]


# -------------------------------------------------------------------- the trust boundary
def post_json(url: str, body: bytes, headers: dict[str, str], *, timeout: float,
              max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES, follow_redirects: bool = False,
              who: str | None = None) -> tuple[int, str]:
    """POST ``body`` as JSON; the final ``(status, text)``, the text read up to ``max_response_bytes``.

    A 3xx is a `RewardError` unless ``follow_redirects``; then only 307/308 (which keep the POST
    and its body) are followed, at most ``MAX_REDIRECTS`` times, never from https to http, and
    ``headers`` are dropped for good once the origin (scheme, host, port) changes. Network
    errors (`http_client.HTTPFailure`) propagate for the caller to retry.

    Args:
        url: the endpoint.
        body: the JSON request body.
        headers: extra headers, sent to ``url``'s origin only.
        timeout: seconds the whole exchange may take (connecting: at most 10 s of them).
        max_response_bytes: an answer longer than this is a `RewardError` (read no further).
        follow_redirects: see above.
        who: how errors name the caller (default ``url``).

    Examples:
        >>> post_json("http://127.0.0.1:8000/score", b"{}", {}, timeout=5)  # doctest: +SKIP
        (200, '{"rewards": []}')
    """
    who = who or url
    target, extra = url, dict(headers)
    for _ in range(MAX_REDIRECTS + 1):
        status, text, location = _request(target, body, extra, timeout, max_response_bytes, who)
        if status not in REDIRECT_STATUS:
            return status, text
        following = _redirect_target(target, status, location, follow_redirects, who)
        if _origin(following) != _origin(target):
            extra = {}  # another origin never sees the caller's headers, even if a later hop comes back
        target = following
    raise RewardError(f"{who} redirected more than {MAX_REDIRECTS} times (last to {target}); point the URL at the "
                      "final address")


def read_json(text: str, who: str, expected: str) -> Any:
    """``json.loads(text)``, where every way the text can fail to parse is a `RewardError`
    naming ``who``: invalid JSON, an integer over Python's digit limit, nesting past the
    recursion limit (``json`` raises ValueError / RecursionError for those two).

    Examples:
        >>> read_json('{"rewards": [1]}', "svc", "")
        {'rewards': [1]}
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        problem = f"invalid JSON ({err})"
    except ValueError as err:  # int(...) past sys.get_int_max_str_digits()
        problem = f"a number Python refuses to read ({err})"
    except RecursionError:
        problem = "JSON nested too deeply to read (past Python's recursion limit)"
    raise RewardError(f"{who} answered {problem}: {text[:300]!r}; {expected}") from None


def _request(url: str, body: bytes, headers: dict[str, str], timeout: float, limit: int,
             who: str) -> tuple[int, str, str | None]:
    """One POST for `post_json` (`http_client.exchange`: no redirect followed, the whole exchange
    within ``timeout``): (status, text, Location); a 200 longer than ``limit`` is a `RewardError`."""
    answer = exchange("POST", url, content=body, headers=headers, timeout=timeout, max_bytes=limit)
    if answer.status == 200 and not answer.whole:
        raise RewardError(f"{who} answered more than {limit} bytes"
                          f"{f' (Content-Length {answer.length})' if answer.length else ''}; an answer is read up to "
                          "max_response_bytes: fix the service, or raise max_response_bytes")
    return answer.status, answer.text, answer.location


def _redirect_target(url: str, status: int, location: str | None, follow: bool, who: str) -> str:
    """Where a redirect leads, or the `RewardError` refusing it."""
    if not follow:
        raise RewardError(f"{who} answered HTTP {status}, a redirect to {location!r}; redirects are not followed "
                          "(one can send the batch and your headers to another host). Point the URL at the final "
                          "address, or pass follow_redirects=True")
    if status not in (307, 308):
        raise RewardError(f"{who} answered HTTP {status}, a redirect to {location!r} that turns the POST into a GET "
                          "without the batch; only 307/308 are followed. Point the URL at the final address")
    target = urllib.parse.urljoin(url, location or "")
    if not location or urllib.parse.urlsplit(target).scheme not in ("http", "https"):
        raise RewardError(f"{who} answered HTTP {status} without a usable http(s) Location ({location!r})")
    if urllib.parse.urlsplit(url).scheme == "https" and urllib.parse.urlsplit(target).scheme == "http":
        raise RewardError(f"{who} redirected from https to {target}, which would send the batch unencrypted; "
                          "refused")
    return target


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # a malformed port: no origin matches it, so nothing is forwarded there
        port = -1
    return parts.scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(parts.scheme)


def _finite_number(value: Any) -> bool:
    """A number a float holds finitely (``float(10**400)`` raises, so it is checked, not converted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _encodable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False
