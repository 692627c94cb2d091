"""A small code-execution service for the tests, speaking SandboxFusion's ``run_code`` API: a
stdlib ``ThreadingHTTPServer`` on 127.0.0.1, run as a subprocess (``python sandbox_service.py``
prints its port), plus `running_service`, which starts it and stops it by pid.

``execute`` is the one place that runs code: `lightning_rlpt.rewards.code.sandbox.run_program`, the
project's own local sandbox.

POST paths (the body is a run_code request):
    /run_code                 runs the code (language "python" only); so does any path not
                              below, so that a test can count its own requests (/log)
    /slow/run_code            sleeps 3 s, then as /run_code
    /die/run_code             the service exits with the request unanswered
    /flaky/run_code           HTTP 503 for its first two requests, then as /run_code
    /sandbox_error/run_code   {"status": "SandboxError", ...}
    /garbage/run_code         a body that is not JSON
    /wrong_schema/run_code    JSON without "status" / "run_result"
    /huge/run_code            4 MiB of text that is not JSON
    /redirect/run_code        HTTP 302 to /redirected/run_code
    /short/run_code           the run's answer cut to half its Content-Length, then the connection closes
GET /log: every request body received so far, as [{"path", "body"}].
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lightning_rlpt.rewards.code.sandbox import Limits, run_program
from reward_server import fetch_log, stop  # noqa: F401 - fetch_log: GET /log, as for the reward server

LOG: list[dict] = []
LOCK = threading.Lock()


def execute(code: str, stdin: str | None, run_timeout: float, memory_mb: int) -> dict:
    """Run Python ``code`` once in the project's local sandbox (bubblewrap where installed, as a
    real service would sandbox it; rlimits only elsewhere); a run_code ``run_result``. Output is
    read up to 8 MiB, past the clients' caps the tests exercise."""
    limits = Limits(timeout=run_timeout, memory_mb=memory_mb if memory_mb > 0 else 1024, max_output_mb=8.0)
    start = time.monotonic()
    result = run_program(code, stdin or "", limits, sandbox="bwrap" if shutil.which("bwrap") else "local-unsafe")
    timed_out = result.status == "timeout"
    code_ = 0 if result.status == "ok" else int(result.status.split()[1]) if result.status.startswith("exit ") else 1
    return {"status": "TimeLimitExceeded" if timed_out else "Finished", "execution_time": time.monotonic() - start,
            "return_code": None if timed_out else code_, "stdout": result.stdout, "stderr": result.stderr}


def run_code(request: dict) -> dict:
    """The run_code response for one request."""
    if request.get("language") != "python":
        return {"status": "SandboxError", "message": f"language {request.get('language')!r} is not served here",
                "compile_result": None, "run_result": None}
    result = execute(request["code"], request.get("stdin"), request.get("run_timeout", 10),
                     request.get("memory_limit_MB", -1))
    ok = result["status"] == "Finished" and result["return_code"] == 0
    return {"status": "Success" if ok else "Failed", "message": "", "compile_result": None, "run_result": result,
            "executor_pod_name": None, "files": {}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def _answer(self, status: int, payload, headers: dict | None = None, cut: int | None = None) -> None:
        """Answer ``payload``; with ``cut``, only its first ``cut`` bytes, then the connection closes."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data if cut is None else data[:cut])
        if cut is not None:
            self.wfile.flush()
            self.close_connection = True

    def do_GET(self) -> None:
        with LOCK:
            self._answer(200, LOG)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with LOCK:
            count = sum(1 for e in LOG if e["path"] == self.path)
            LOG.append({"path": self.path, "body": body})
        if self.path == "/slow/run_code":
            time.sleep(3)
        if self.path == "/die/run_code":
            os._exit(1)  # a service that dies with the request in flight
        if self.path == "/flaky/run_code" and count < 2:
            return self._answer(503, {"detail": "warming up"})
        canned = {"/sandbox_error/run_code": {"status": "SandboxError", "message": "runner died", "run_result": None},
                  "/garbage/run_code": b"<html>502 Bad Gateway</html>",
                  "/wrong_schema/run_code": {"result": "ok"},
                  "/huge/run_code": b"x" * (4 << 20)}
        if self.path in canned:
            return self._answer(200, canned[self.path])
        if self.path == "/redirect/run_code":
            return self._answer(302, b"", {"Location": "/redirected/run_code"})
        if self.path == "/short/run_code":
            data = json.dumps(run_code(body)).encode()
            return self._answer(200, data, cut=len(data) // 2)
        self._answer(200, run_code(body))


@contextlib.contextmanager
def running_service(timeout: float = 60.0):  # importing the package takes 8 s on 2 idle cores
    """Start this file as a subprocess; yield ``(base_url, process)``; stop it by pid at the end."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__)))
    try:
        port = [None]
        reader = threading.Thread(target=lambda: port.__setitem__(0, proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not (port[0] or "").strip().isdigit():
            raise RuntimeError(f"sandbox service did not start within {timeout} s (got {port[0]!r})")
        yield f"http://127.0.0.1:{int(port[0])}", proc
    finally:
        stop(proc)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
