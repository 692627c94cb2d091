"""A real reward service for the tests: a stdlib ``ThreadingHTTPServer`` on 127.0.0.1, run as a
subprocess (``python reward_server.py`` prints its port), plus `running_server`, which starts it
and stops it by pid.

POST paths (the body is `HTTPReward`'s JSON):
    /length        {"rewards": [len(text of each completion)]}; null where a "task" column is not "math"
    /slow          sleeps 3 s, then as /length
    /flaky         HTTP 503 for the first two requests, then as /length
    /wrong_count   one reward too few
    /not_numbers   strings
    /bad_json      a body that is not JSON
    /refuse        HTTP 400
    /redirect/<status>/<port>/<path>   answers <status> with Location http://127.0.0.1:<port>/<path>
    /huge_int      every reward 10**400 (valid JSON; no float holds it)
    /long_int      a 5,000-digit reward (past Python's 4,300-digit limit for reading an int)
    /deep          {"rewards": [[[...]]]} nested 100,000 deep
    /oversize      as /length plus a 5,000,000-character "debug" field (over the default 4 MiB cap)
    /endless       announces 10**12 bytes and sends spaces until the client hangs up
    /drip          a valid answer, one byte every 0.2 s (each read is quick, the whole answer is not)
GET /log: every request received so far, as [{"path", "method", "headers", "n", "keys", "trainer_state",
"rewards"}]. Any other GET is logged and answered {"rewards": [100.0] * n} (n from ``?n=``): the
answer of a host that a redirect sent a request to.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG: list[dict] = []
LOCK = threading.Lock()


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def _lengths(body: dict) -> list:
    tasks = body.get("task", ["math"] * len(body["completions"]))
    return [float(len(_text(c))) if t == "math" else None for c, t in zip(body["completions"], tasks)]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def _answer(self, status: int, payload) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/log":
            with LOCK:
                return self._answer(200, LOG)
        n = int(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("n", ["1"])[0])
        with LOCK:
            LOG.append({"path": self.path, "method": "GET", "headers": self._headers(), "n": n, "rewards": [100.0] * n})
        self._answer(200, {"rewards": [100.0] * n})

    def _headers(self) -> dict:
        return {k.lower(): v for k, v in self.headers.items()}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = len(body["completions"])
        with LOCK:
            count = sum(1 for e in LOG if e["path"] == self.path)
            entry = {"path": self.path, "method": "POST", "headers": self._headers(), "n": n, "keys": sorted(body),
                     "trainer_state": body.get("trainer_state"), "completions": body["completions"], "rewards": None}
            LOG.append(entry)
        if self.path.startswith("/redirect/"):
            _, _, status, port, path = self.path.split("/", 4)
            return self._redirect(int(status), f"http://127.0.0.1:{port}/{path}")
        if self.path == "/huge_int":
            return self._answer(200, {"rewards": [10**400] * n})
        if self.path == "/long_int":
            return self._answer(200, b'{"rewards": [' + b"9" * 5000 + b"]}")
        if self.path == "/endless":
            return self._endless()
        if self.path == "/drip":
            return self._drip(json.dumps({"rewards": _lengths(body)}).encode())
        if self.path == "/deep":
            return self._answer(200, b'{"rewards": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        if self.path == "/slow":
            time.sleep(3)
        if self.path == "/short" or (self.path == "/short_once" and count == 0):
            return self._short(json.dumps({"rewards": _lengths(body)}).encode())
        if self.path == "/flaky" and count < 2:
            return self._answer(503, {"error": "warming up"})
        if self.path == "/refuse":
            return self._answer(400, {"error": "no such task"})
        if self.path == "/bad_json":
            return self._answer(200, b"<html>oops</html>")
        rewards = _lengths(body)
        if self.path == "/wrong_count":
            rewards = rewards[:-1]
        if self.path == "/not_numbers":
            rewards = ["high"] * n
        entry["rewards"] = rewards
        self._answer(200, {"rewards": rewards, **({"debug": "x" * 5_000_000} if self.path == "/oversize" else {})})

    def _drip(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            for i in range(len(data)):
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client gave up and closed the connection
            pass

    def _endless(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(10**12))
        self.end_headers()
        try:
            while True:
                self.wfile.write(b" " * 2**16)
        except OSError:  # the client stopped reading and closed the connection
            pass

    def _short(self, data: bytes) -> None:
        """The connection drops mid-answer: half the announced Content-Length, then the socket closes."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def _redirect(self, status: int, location: str) -> None:
        self.send_response(status)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextlib.contextmanager
def running_server(timeout: float = 20.0):
    """Start this file as a subprocess; yield ``(base_url, process)``; stop it by pid at the end."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdout=subprocess.PIPE, text=True)
    try:
        port = _read_port(proc, timeout)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop(proc)


def _read_port(proc: subprocess.Popen, timeout: float) -> int:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0].strip().isdigit():
        stop(proc)
        raise RuntimeError(f"reward server did not start within {timeout} s (got {box!r})")
    return int(box[0])


def stop(proc: subprocess.Popen) -> None:
    """Terminate the server by its pid, then kill it if it has not exited within 5 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def fetch_log(base_url: str) -> list[dict]:
    import urllib.request

    with urllib.request.urlopen(base_url + "/log", timeout=5) as response:
        return json.loads(response.read())


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
