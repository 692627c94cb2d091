"""Every HTTP exchange of the package, on one maintained client (``httpx``): the reward services
(`rewards.http.HTTPReward`, `rewards.code.remote_client.RunCodeClient`) and the rollout servers
(`rollout.servers.pool.ServerPool`, `rollout.vllm.server`, `rollout.vllm.reach`,
`rollout.vllm.remote_engine`).

What this module owns, so that no caller writes it again:

- **timeouts by phase**: ``connect_timeout`` to open a connection (a host whose link is down
  sends no refusal: without it a request waits its whole timeout) and ``timeout`` for the whole
  exchange, a deadline checked between reads, so a server that drips bytes is cut off at it;
- **no redirect followed**: a 3xx comes back as an `Answer` with its ``location`` (a caller that
  follows some, `HTTPReward`, decides itself);
- **a size cap**: the body is read up to ``max_bytes`` (one byte more tells "too long" from
  "exactly the cap"), decoded, so a compressed body cannot expand past it;
- **torn answers**: a body shorter than its ``Content-Length`` (the connection dropped
  mid-answer) is an `HTTPFailure` ``IncompleteRead``, never handed over as the answer;
- **failures named by kind** (`HTTPFailure.kind`: ``ConnectionError``, ``ConnectTimeout``,
  ``ReadTimeout``, ``WriteTimeout``, ``IncompleteRead``): the callers' messages and tests read these.

Retries stay with the callers, because what deserves another try differs: a reward service is
retried on 5xx and network errors, a rollout server that fails is dropped from its pool.

Examples:
    >>> answer = exchange("POST", "http://127.0.0.1:8000/score", json={}, timeout=5)  # doctest: +SKIP
    >>> answer.status, answer.json()  # doctest: +SKIP
    (200, {'rewards': []})
"""
from __future__ import annotations

import json as jsonlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_MAX_BYTES = 256 * 2**20  # a rollout's completions with log-probs; the reward clients cap far lower


class HTTPFailure(OSError):
    """The exchange failed on the way (no answer, or a torn one): worth a retry or a drop, never
    parsed. ``kind`` names it (``ConnectTimeout``, ``ReadTimeout``, ``ConnectionError``, ...)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: ``data`` is at most the cap; ``whole`` says the body ended within it;
    ``location`` and ``length`` are the ``Location`` and ``Content-Length`` headers."""

    status: int
    data: bytes
    whole: bool
    location: str | None = None
    length: str | None = None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    def json(self) -> Any:
        return jsonlib.loads(self.data)


def new_client(max_connections: int = 64) -> httpx.Client:
    """A client (shared between threads: httpx's ``Client`` is thread-safe) following no redirect,
    with up to ``max_connections`` open at once, each used for one exchange only.

    Why no keep-alive: a server may close a connection after an error without saying so (uvicorn,
    vLLM's server, after an unhandled exception answered 500). A kept connection reused in the
    moment before its close arrives fails with "Connection reset by peer", and the pool would drop
    a healthy server for it: a failed snapshot-directory probe followed by the real reload did
    exactly that. A connection costs well under a millisecond on the links these calls use."""
    return httpx.Client(follow_redirects=False,
                        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=0))


_shared: httpx.Client | None = None
_shared_lock = threading.Lock()


def shared_client() -> httpx.Client:
    """The process's pool for callers without one of their own (health probes, reward services)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = new_client()
        return _shared


def exchange(method: str, url: str, *, json: Any = None, content: bytes | None = None,
             headers: dict[str, str] | None = None, timeout: float, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
             max_bytes: int = DEFAULT_MAX_BYTES, client: httpx.Client | None = None) -> Answer:
    """One request and its answer, whatever the status (see the module docstring); `HTTPFailure`
    when none came whole. ``json`` or ``content`` is the body (``content`` is sent as JSON)."""
    if content is not None:
        headers = {"Content-Type": "application/json", **(headers or {})}
    limits = httpx.Timeout(timeout, connect=min(connect_timeout, timeout))
    deadline = time.monotonic() + timeout
    try:
        with (client or shared_client()).stream(method, url, json=json, content=content, headers=headers,
                                                timeout=limits) as response:
            return _read(response, deadline, timeout, max_bytes)
    except httpx.RemoteProtocolError as err:
        kind = "IncompleteRead" if "complete message body" in str(err) else "ConnectionError"
        raise HTTPFailure(kind, str(err) or type(err).__name__) from err
    except httpx.HTTPError as err:  # transport errors: connect, read, write, protocol
        kind = type(err).__name__ if isinstance(err, httpx.TimeoutException) else "ConnectionError"  # Connect/Read/...Timeout
        raise HTTPFailure(kind, str(err) or type(err).__name__) from err


def _read(response: httpx.Response, deadline: float, timeout: float, max_bytes: int) -> Answer:
    headers = response.headers
    data = bytearray()
    # iter_bytes() without a chunk size yields each network read as it comes (a chunk size would
    # wait for that many bytes, however slowly they drip), decoded
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) > max_bytes:
            return Answer(response.status_code, bytes(data[:max_bytes]), False, headers.get("location"),
                          headers.get("content-length"))
        if time.monotonic() > deadline:
            raise HTTPFailure("ReadTimeout", f"the answer took more than {timeout:g} s")
    return Answer(response.status_code, bytes(data), True, headers.get("location"), headers.get("content-length"))
