"""`RunCodeClient`: one program run on a code-execution service through SandboxFusion's
``run_code`` API (``POST <url>``), with timeouts, retries and a cap on the answer's size.

Request (JSON): ``code``, ``language``, ``stdin``, ``run_timeout``, ``compile_timeout`` and
``memory_limit_MB``. Answer: ``status`` (``"Success"``: it compiled, ran and exited 0;
``"Failed"``: a non-zero exit, a compile error or a timeout; ``"SandboxError"``: the service
itself failed), ``message``, and ``run_result`` / ``compile_result``, each ``{"status":
"Finished" | "TimeLimitExceeded" | "Error", "return_code", "stdout", "stderr",
"execution_time"}`` or null.

The retry rules are `HTTPReward`'s (its ``RETRY_STATUS``, connection errors, timeouts; a
``SandboxError`` counts as a failed attempt too); redirects are refused, so candidate code is
never posted anywhere but ``url``.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ...http_client import HTTPFailure, exchange
from ..calling import RewardError, RewardUnavailable
from ..http import RETRY_STATUS

RUN_STATUSES = ("Finished", "TimeLimitExceeded", "Error")


@dataclass(frozen=True)
class RunAnswer:
    """What the service reports about one run (only the fields the reward reads).

    ``oversized``: the answer went past the client's size cap, so nothing of it is kept; the
    run printed more than the cap allows, which counts as a failed run.
    """

    status: str
    run_status: str | None = None
    return_code: int | None = None
    stdout: str = ""
    oversized: bool = False

    @property
    def ok(self) -> bool:
        """The program ran to the end and exited 0."""
        return self.status == "Success" and self.run_status == "Finished" and self.return_code == 0

    def why(self) -> str:
        """Why the run is not `ok`, in words."""
        if self.oversized:
            return "its output went past the answer size cap (max_response_mb)"
        if self.run_status == "TimeLimitExceeded":
            return "it ran past run_timeout"
        if self.run_status is None:
            return "it did not run (compile error)"
        return f"it exited with code {self.return_code}"


class RunCodeClient:
    """Posts programs to a ``run_code`` endpoint and reads the answers.

    Args:
        url: the endpoint, e.g. ``http://127.0.0.1:8080/run_code``.
        timeout: seconds one request may take, connecting and reading included.
        retries: further attempts after a failed one.
        backoff: seconds before the first retry, doubled before each next one.
        max_response_bytes: answers longer than this are not read further.
        headers: extra HTTP headers (e.g. an ``Authorization`` token).
    """

    def __init__(self, url: str, *, timeout: float, retries: int, backoff: float, max_response_bytes: int,
                 headers: dict[str, str] | None = None):
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.max_response_bytes, self.headers = max_response_bytes, dict(headers or {})

    def run(self, code: str, *, language: str, stdin: str | None, run_timeout: float, compile_timeout: float,
            memory_mb: int) -> RunAnswer:
        """Run ``code`` once; `RewardUnavailable` when every attempt fails, `RewardError` when the
        service answers outside the API."""
        body = json.dumps({"code": code, "language": language, "stdin": stdin, "run_timeout": run_timeout,
                           "compile_timeout": compile_timeout, "memory_limit_MB": memory_mb}).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, raw, whole = self._send(body)
            except HTTPFailure as err:  # no answer, or a torn one
                last = str(err)
                continue
            if status == 200 and not whole:
                return self._oversized(raw)
            if status == 200:
                answer = self._parse(raw)
                if answer is not None:
                    return answer
                last = f"SandboxError: {raw[:200]!r}"
                continue
            self._refuse(status, raw)
            last = f"HTTP {status}: {raw[:200]!r}"
        raise RewardUnavailable(f"code-execution service {self.url} failed {self.retries + 1} attempt(s) (timeout "
                                f"{self.timeout:g} s each); last: {last}. Check that it is running and reachable, or "
                                "raise RemoteCodeReward(timeout=..., retries=...)")

    def _send(self, body: bytes) -> tuple[int, bytes, bool]:
        """Status, body (at most the cap) and whether it was read whole (`http_client.exchange`)."""
        answer = exchange("POST", self.url, content=body, headers=self.headers, timeout=self.timeout,
                          max_bytes=self.max_response_bytes)
        return answer.status, answer.data, answer.whole

    def _refuse(self, status: int, raw: bytes) -> None:
        """Raise for an HTTP status that retrying would not fix."""
        if 300 <= status < 400:
            raise RewardError(f"code-execution service {self.url} answered a redirect (HTTP {status}); redirects are "
                              "refused so that candidate code goes nowhere else: give the final URL")
        if status not in RETRY_STATUS:
            raise RewardError(f"code-execution service {self.url} answered HTTP {status}: {raw[:300]!r}; the request "
                              "was refused, so retrying would not help (check the URL: SandboxFusion's ends in "
                              "/run_code)")

    def _oversized(self, raw: bytes) -> RunAnswer:
        # The request is small and a run_code answer is a JSON object, so an answer over the cap
        # that starts like one carries a run that printed too much: the candidate's failure. One
        # that does not is not this API at all.
        if raw.lstrip()[:1] == b"{":
            return RunAnswer(status="Failed", oversized=True)
        raise RewardError(f"code-execution service {self.url} answered more than {self.max_response_bytes} bytes "
                          f"that are not a run_code answer: {raw[:200]!r}")

    def _parse(self, raw: bytes) -> RunAnswer | None:
        """The answer, or None for a ``SandboxError`` (the service failed: worth another try)."""
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as err:
            raise RewardError(f"code-execution service {self.url} answered invalid JSON ({err}): {raw[:300]!r}; "
                              "it must answer SandboxFusion's run_code response") from err
        status = data.get("status") if isinstance(data, dict) else None
        run = data.get("run_result") if isinstance(data, dict) else None
        if status == "SandboxError" or (isinstance(run, dict) and run.get("status") == "Error"):
            return None
        if status not in ("Success", "Failed") or not _valid_run(run) or (status == "Success" and run is None):
            raise RewardError(f"code-execution service {self.url} answered {raw[:300]!r}, which is not a run_code "
                              'response: it needs "status" ("Success", "Failed" or "SandboxError") and "run_result" '
                              '{"status", "return_code", "stdout", ...} (null only when the code did not compile)')
        if run is None:
            return RunAnswer(status=status)
        return RunAnswer(status=status, run_status=run["status"], return_code=run.get("return_code"),
                         stdout=run.get("stdout") or "")


def _valid_run(run: object) -> bool:
    if run is None:
        return True
    if not isinstance(run, dict) or run.get("status") not in RUN_STATUSES:
        return False
    code, stdout = run.get("return_code"), run.get("stdout")
    return (code is None or (type(code) is int)) and (stdout is None or isinstance(stdout, str))
