"""`ServerPool`: completions from one or more servers over HTTP (vLLM's ``/v1/completions``), with failover.

Each prompt row is one ``POST /v1/completions`` with token ids as the prompt, its own
``seed``, ``logprobs=0`` (the sampled token's log-prob) and ``return_token_ids``. Rows go to
the live server with the fewest *outstanding tokens* (prompt + ``max_tokens`` of the requests
it is still serving): a long request counts for more than a short one, so two servers end up
with about the same work, not the same count. At most ``max_inflight`` requests run at once;
a freed slot is refilled with the next row, again to the least-loaded server.

Every call has a timeout (``request_timeout`` for completions, ``control_timeout`` for the
control routes). A server that refuses connections, times out or answers 5xx is marked dead
with the reason, and its unfinished rows go to the others; when no server is left the call
raises a `ServerFailure` that names each server, its reason and ``where`` (the trainer step),
so a run stops instead of hanging. A 4xx answer is a bad request, not a dead server: it is
raised at once with the server's message.

Nothing waits in silence: a request (completion or control call) still unanswered after
``warn_after`` seconds logs a warning naming the server, the route and the step, and dropping a
server logs one naming it, the step and why. `post_all` (the weight sync's calls) drops a server
it cannot reach and goes on with the others, as a rollout does; `revive` brings back dropped
servers that answer ``/health`` again (the engine syncs and checks them before they sample).

Examples:
    >>> pool = ServerPool(["http://127.0.0.1:8000"], model="ckpt_dir")  # doctest: +SKIP
    >>> pool.complete([{"prompt": [1, 4, 5], "max_tokens": 4, "seed": 0}])  # doctest: +SKIP
    [([7, 9, 2], [-0.1, -0.3, -0.01])]
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from ...http_client import HTTPFailure, exchange, new_client

log = logging.getLogger(__name__)


class ServerFailure(RuntimeError):
    """No live server could serve a request (each server's reason in the message)."""


class BadRequest(ValueError):
    """A server rejected a request as malformed (HTTP 4xx)."""


class ServerPool:
    """Send completion requests to servers balanced by outstanding tokens; control calls to all.

    Args:
        urls: server base URLs (``http://host:port``).
        model: the served model name (``--model`` or ``--served-model-name``).
        request_timeout: seconds one completion may take before its server counts as hung.
        control_timeout: seconds for health, version and weight-reload calls.
        max_inflight: completion requests in flight at once, over all servers.
        warn_after: seconds a request may wait before a warning names the server it waits on.
        connect_timeout: seconds a connection may take to open. A host whose link is down sends no
            refusal: without this bound a new request would wait the whole ``request_timeout``.
        kind: what the servers are called in warnings and errors (``"vLLM server"``).

    ``dead`` maps a failed server's URL to the reason; ``where`` (set by the engine) names the
    trainer step in errors.

    Examples:
        >>> pool = ServerPool(["http://127.0.0.1:8000", "http://127.0.0.1:8001"], model="m")  # doctest: +SKIP
        >>> pool.post_all("/reset_prefix_cache")  # doctest: +SKIP
    """

    def __init__(self, urls: list[str], model: str, *, request_timeout: float = 600.0, control_timeout: float = 600.0,
                 max_inflight: int = 64, warn_after: float = 60.0, connect_timeout: float = 10.0,
                 kind: str = "vLLM server"):
        if not urls:
            raise ValueError(f"give at least one {kind} URL (urls=[...]) or launch=dict(...) to start one")
        if min(request_timeout, control_timeout, warn_after, connect_timeout) <= 0 or max_inflight < 1:
            raise ValueError(f"request_timeout, control_timeout, warn_after and connect_timeout must be > 0 s and "
                             f"max_inflight >= 1 (got {request_timeout}, {control_timeout}, {warn_after}, "
                             f"{connect_timeout}, {max_inflight})")
        self.urls = [u.rstrip("/") for u in urls]
        self.model, self.request_timeout, self.control_timeout = model, request_timeout, control_timeout
        self.max_inflight, self.warn_after, self.connect_timeout = max_inflight, warn_after, connect_timeout
        self.dead: dict[str, str] = {}
        self.where, self.kind = "start-up", kind
        self.served: dict[str, int] = {u: 0 for u in self.urls}  # completions answered, per server
        self.warned: set[tuple[str, str, str]] = set()  # (server, route, step) already warned about
        self.client = new_client(max_inflight + 4)  # one pool of connections: completions and control calls
        self.probing: dict[str, tuple[int, int]] = {}  # dropped server -> (syncs before its next probe, failed probes)

    @property
    def live(self) -> list[str]:
        return [u for u in self.urls if u not in self.dead]

    # ---------------------------------------------------------------- dropping and reviving servers
    def drop(self, url: str, reason: str) -> None:
        """Stop sending to ``url`` (the first reason is kept) and say so once."""
        if url not in self.dead:
            self.dead[url] = reason
            log.warning("%s %s dropped at %s: %s (%d of %d servers left)", self.kind, url, self.where, reason,
                        len(self.live), len(self.urls))

    def revive(self) -> list[str]:
        """Dropped servers that answer ``/health`` again, taken back (the caller must sync and check
        them before they sample: they may hold other weights)."""
        back = []
        for url in [u for u in self.urls if u in self.dead]:
            skip, failed = self.probing.get(url, (0, 0))
            if skip:  # a host that stays away costs a probe timeout only every 2^k syncs (at most 64)
                self.probing[url] = (skip - 1, failed)
                continue
            try:
                healthy = self.request("GET", url, "/health", None, min(self.control_timeout, 10.0)).status == 200
            except HTTPFailure:
                healthy = False
            if healthy:
                self.probing.pop(url, None)
                log.warning("%s %s answers again at %s (dropped for: %s): it rejoins after a full weight "
                            "sync and checks", self.kind, url, self.where, self.dead.pop(url))
                back.append(url)
            else:
                self.probing[url] = (min(2 ** failed, 64) - 1, failed + 1)
        return back

    def adopt(self, live: list[str]) -> None:
        """Take rank 0's view after its sync: exactly ``live`` hold the synced weights."""
        for url in self.urls:
            if url in live:
                self.dead.pop(url, None)
            else:
                self.drop(url, "not synced by rank 0 (dropped there)")

    def waiting(self, url: str, what: str) -> threading.Timer:
        """A started timer that warns when a request to ``url`` is still unanswered after ``warn_after`` s."""
        where, limit = self.where, self.request_timeout if what == "/v1/completions" else self.control_timeout

        def warn() -> None:
            if (url, what, where) not in self.warned:  # once per server, route and step, not per row
                self.warned.add((url, what, where))
                log.warning("%s %s has not answered %s for %.0f s at %s (it counts as hung after %.0f s)",
                            self.kind, url, what, self.warn_after, where, limit)

        timer = threading.Timer(self.warn_after, warn)
        timer.daemon = True
        timer.start()
        return timer

    # ---------------------------------------------------------------- control routes
    def get(self, url: str, path: str) -> Any:
        return self._call("GET", url, path, None)

    def post(self, url: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._call("POST", url, path, body)

    def post_all(self, path: str, body: dict[str, Any] | None = None) -> list[Any]:
        """``POST`` to every live server (in order). One that cannot be reached or times out is
        dropped and the others go on; an error answer, or no server left, raises naming them."""
        answers = []
        for url in self.live:
            try:
                answers.append(self.post(url, path, body))
            except ServerFailure:
                if url not in self.dead:  # it answered with an error: not a lost server
                    raise
        if not self.live:
            raise ServerFailure(self.failure(f"no {self.kind} is left for {path}"))
        return answers

    def _call(self, method: str, url: str, path: str, body: dict[str, Any] | None) -> Any:
        timer = self.waiting(url, path)
        try:
            answer = self.request(method, url, path, body, self.control_timeout)
        except HTTPFailure as err:
            self.drop(url, f"{err.kind} on {path}: {err.detail}")
            raise ServerFailure(self.failure(f"{path} to {url} failed")) from err
        finally:
            timer.cancel()
        if answer.status >= 400:
            raise ServerFailure(f"{self.kind} {url} answered {answer.status} to {path} at {self.where}: "
                                f"{answer.text[:500]}")
        if not answer.data:
            return None
        try:
            return answer.json()
        except ValueError:  # /v1/load_lora_adapter answers plain text
            return answer.text

    # ---------------------------------------------------------------- completions
    def complete(self, requests_: list[dict[str, Any]]) -> list[tuple[list[int], list[float]]]:
        """``(token_ids, logprobs)`` per request body (each needs ``prompt`` and ``max_tokens``),
        in the order given, whichever server answered."""
        results: list[Any] = [None] * len(requests_)
        pending = list(range(len(requests_)))[::-1]  # a stack: pop() takes the lowest index first
        load = {u: 0 for u in self.urls}
        running: dict[Future, tuple[int, str]] = {}
        with ThreadPoolExecutor(max_workers=min(self.max_inflight, len(requests_)) or 1) as pool:
            while pending or running:
                while pending and len(running) < self.max_inflight:
                    index = pending.pop()
                    url = self._least_loaded(load)
                    load[url] += cost(requests_[index])
                    running[pool.submit(self._completion, url, requests_[index])] = (index, url)
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    index, url = running.pop(future)
                    load[url] -= cost(requests_[index])
                    try:
                        results[index] = future.result()
                        self.served[url] += 1
                    except HTTPFailure as err:
                        self.drop(url, f"{err.kind} on a completion: {err.detail}")
                        pending.append(index)  # retried on another server
                    except ServerError as err:
                        self.drop(url, f"ServerError on a completion: {err}")
                        pending.append(index)  # retried on another server
                    except BaseException:
                        for other in running:
                            other.cancel()
                        raise
        return results

    def _least_loaded(self, load: dict[str, int]) -> str:
        live = self.live
        if not live:
            raise ServerFailure(self.failure(f"no {self.kind} is left to sample from"))
        return min(live, key=lambda u: (load[u], self.urls.index(u)))

    def _completion(self, url: str, body: dict[str, Any]) -> tuple[list[int], list[float]]:
        if url in self.dead:  # died while this request waited for a slot
            raise ServerError(self.dead[url])
        timer = self.waiting(url, "/v1/completions")
        try:
            answer = self.request("POST", url, "/v1/completions", {"model": self.model, **body}, self.request_timeout)
        finally:
            timer.cancel()
        if answer.status >= 500:
            raise ServerError(f"HTTP {answer.status}: {answer.text[:300]}")
        if answer.status >= 400:
            raise BadRequest(f"{self.kind} {url} rejected a completion request at {self.where}: {answer.text[:500]}")
        choice = answer.json()["choices"][0]
        return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]

    def request(self, method: str, url: str, path: str, body: dict[str, Any] | None, timeout: float):
        """One exchange on the pool's connections: a cut link fails a new connection in
        ``connect_timeout``; a request already sent waits ``timeout`` s for its whole answer."""
        return exchange(method, url + path, json=body, timeout=timeout, connect_timeout=self.connect_timeout,
                        client=self.client)

    def failure(self, what: str) -> str:
        """A `ServerFailure`'s message: what failed, the step, and each dropped server's reason."""
        reasons = "; ".join(f"{u}: {r}" for u, r in self.dead.items()) or "none recorded"
        return (f"{what} at {self.where} (servers {self.urls}; failed: {reasons}). Checkpoints saved so far are "
                "intact: restart the servers and resume with trainer.fit(..., ckpt_path=<last checkpoint>)")


class ServerError(RuntimeError):
    """A server-side failure (5xx, or the server already marked dead): retry elsewhere."""


def cost(body: dict[str, Any]) -> int:
    """A request's weight for balancing: tokens the server must hold (prompt + budget)."""
    return len(body["prompt"]) + int(body.get("max_tokens") or 0)
