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
GET /log: every POST received so far, as [{"path", "n", "keys", "trainer_state", "rewards"}].
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
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
        with LOCK:
            self._answer(200, LOG)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = len(body["completions"])
        with LOCK:
            count = sum(1 for e in LOG if e["path"] == self.path)
            entry = {"path": self.path, "n": n, "keys": sorted(body), "trainer_state": body.get("trainer_state"),
                     "completions": body["completions"], "rewards": None}
            LOG.append(entry)
        if self.path == "/slow":
            time.sleep(3)
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
        self._answer(200, {"rewards": rewards})


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
