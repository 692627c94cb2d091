"""Run untrusted Python against tests in a subprocess with limits (the parent's side).

`run_in_sandbox` starts ``python -I sandbox_child.py`` in a fresh temporary directory, in its
own session, with a clean environment (no API tokens leak in), and hands it the code and the
tests on stdin. The child (see ``sandbox_child.py``) limits the worker that runs the code:

- wall-clock ``timeout``: the worker is killed (SIGKILL) and every process it started is killed
  and reaped; the parent kills the whole session a few seconds later still, as a backstop;
- ``memory_mb``: ``RLIMIT_AS`` per process; an allocation beyond it raises MemoryError, which
  ends the run as ``"memory"``;
- CPU seconds: ``RLIMIT_CPU`` of the timeout rounded up plus one (SIGXCPU, then SIGKILL a second
  later), which code burning CPU on several threads at once can reach before the timeout;
- files: ``RLIMIT_FSIZE`` (``max_file_mb``); the code's stdout and stderr go to /dev/null;
- network: a new network namespace (nothing but a downed loopback) when the kernel allows it
  (root, or unprivileged user namespaces); else a guard that makes Python refuse non-Unix
  sockets, which code calling the C library through ctypes can get past. The outcome says
  which held.

It is a guard against accidents and runaway code (loops, memory, output, stray connections),
not a security boundary: the code runs as the trainer's user and can read and write its files.
Run untrusted models' code in a container or VM as well.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Sequence

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
BACKSTOP_S = 5.0  # the parent kills the session this long after the child's own timeout


@dataclass(frozen=True)
class Outcome:
    """How one run ended.

    Args:
        passed: one bool per test.
        status: ``"ok"``, ``"exit N"`` (the code ended the process itself), ``"timeout"``,
            ``"memory"`` or ``"killed by SIG..."``.
        network: ``"namespace"`` or ``"guard"``: the network protection that held.
    """

    passed: tuple[bool, ...]
    status: str
    network: str

    @property
    def killed(self) -> bool:
        """Stopped by a limit (or a signal) rather than by running to its end."""
        return self.status in ("timeout", "memory") or self.status.startswith("killed")


def run_in_sandbox(code: str, tests: Sequence[str], *, timeout: float = 5.0, memory_mb: int = 1024,
                   max_file_mb: int = 16, network: str = "auto", python: str | None = None) -> Outcome:
    """Run ``code``, then each test (Python statements, e.g. ``assert f(1) == 2``), in a sandbox.

    Args:
        code: the program; tests run in its global namespace, which is named ``__solution__``
            (``if __name__ == "__main__":`` blocks do not run).
        tests: Python snippets; a test passes when it runs without raising.
        timeout: wall-clock seconds for the code and all tests together, counted from the
            worker's start (the interpreter's start, about 50 ms, comes before).
        memory_mb: address-space limit of each process.
        max_file_mb: size limit of any file the code writes.
        network: ``"auto"`` (a network namespace when possible, else the socket guard) or
            ``"guard"`` (the socket guard only).
        python: the interpreter; by default the running one, so installed packages import.

    Example:
        >>> run_in_sandbox("def add(a, b): return a + b", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"]).passed
        (True, False)
    """
    spec = {"code": code, "tests": list(tests), "timeout": timeout, "memory_bytes": memory_mb << 20,
            "cpu_seconds": math.ceil(timeout) + 1, "file_bytes": max_file_mb << 20, "network": network,
            "nonce": secrets.token_hex(8)}
    with tempfile.TemporaryDirectory(prefix="rlpt-sandbox-", ignore_cleanup_errors=True) as cwd:
        proc = subprocess.Popen([python or sys.executable, "-I", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=cwd, env=_clean_env(cwd), start_new_session=True)
        try:
            out, err = proc.communicate(json.dumps(spec).encode(), timeout=timeout + BACKSTOP_S)
        except subprocess.TimeoutExpired:
            _kill_session(proc.pid)
            proc.communicate()
            return Outcome(tuple(False for _ in tests), "timeout", "unknown")
        finally:
            _kill_session(proc.pid)  # anything left in the session
    try:
        result = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"the code sandbox failed (exit {proc.returncode}): {err.decode(errors='replace')[-800:]}")
    return Outcome(tuple(result["passed"]), result["status"], result["network"])


def _clean_env(cwd: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"}
    env.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
