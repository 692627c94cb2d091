"""Run untrusted Python in a sandbox: a program on stdin/stdout, or code against assert-style tests.

Two entry points, both under the same `Limits` and the same sandbox (``sandbox_launch.py``:
bubblewrap, or the opt-in ``"local-unsafe"`` mode):

- `run_program`: one program, its standard input given, its standard output and error
  returned (each read up to a cap). For stdin/stdout tests, and for services built on it.
- `run_tests`: the verdict of assert-style tests is decided outside the candidate's
  interpreter. The candidate's code runs in one sandbox (``sandbox_candidate.py``); the tests
  run in a second, clean one (``sandbox_checker.py``) where the candidate's functions and
  classes are proxies. A call crosses to the candidate's process and only its return value
  comes back, through a strict serializer of plain data (``sandbox_codec.py``). The candidate
  can neither patch the tests' builtins, nor see their frames, nor return an object whose
  ``__eq__`` always answers True, nor reach the checker's verdict (another PID namespace).
  A verdict that cannot be trusted (the checker died, its report is malformed) is reported
  as such (``"untrusted: ..."``), never as a pass.

Limits inside both: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, the process count,
a tmpfs of ``max_file_mb`` (all bytes written, under bwrap), the wall clock from the parent.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Sequence

from .sandbox_inside import MEMORY_EXIT
from .sandbox_launch import Sandboxed, SandboxUnavailable, check_mode

__all__ = ["Limits", "Outcome", "ProgramResult", "SandboxUnavailable", "check_mode", "run_program", "run_tests"]
START_S = 1.0  # allowance for starting the sandbox and the interpreter, on top of the timeout
KILLED = ("timeout", "memory", "untrusted")


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use.

    Args:
        timeout: wall-clock seconds for the run (plus about a second to start the sandbox).
        memory_mb: address-space limit of each process, in MiB.
        max_file_mb: all bytes the code may keep written (the size of its ``/tmp``); with
            ``sandbox="local-unsafe"`` a limit per file only.
        max_processes: processes (and threads) at once.
        max_output_mb: bytes of standard output read back; a program that writes more is killed.
    """

    timeout: float = 10.0
    memory_mb: int = 1024
    max_file_mb: int = 16
    max_processes: int = 32
    max_output_mb: float = 1.0

    def __post_init__(self):
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds (got {self.timeout!r})")
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb={self.memory_mb!r} is too small for a Python process; give at least 64 (MiB)")
        if self.max_file_mb < 1 or self.max_processes < 4 or not self.max_output_mb > 0:
            raise ValueError(f"max_file_mb must be >= 1, max_processes >= 4 and max_output_mb > 0 (got {self})")

    def inside(self) -> dict:
        """The rlimits the sandboxed script sets on itself."""
        return {"memory_bytes": self.memory_mb << 20, "cpu_seconds": math.ceil(self.timeout) + 1,
                "file_bytes": self.max_file_mb << 20, "processes": self.max_processes}


@dataclass(frozen=True)
class ProgramResult:
    """How one program ran.

    Args:
        stdout: its standard output (decoded as UTF-8, errors replaced), up to ``max_output_mb``.
        stderr: the last part of its standard error, up to 64 KiB.
        status: ``"ok"``, ``"exit N"``, ``"timeout"``, ``"memory"``, ``"killed by SIG..."``, or
            ``"output"`` (it wrote more than ``max_output_mb`` and was killed).
    """

    stdout: str
    stderr: str
    status: str

    @property
    def killed(self) -> bool:
        """Stopped by a limit (time, memory, CPU) or a signal, so its output says nothing."""
        return self.status.startswith(KILLED) or self.status.startswith("killed")


@dataclass(frozen=True)
class Outcome:
    """How assert-style tests went.

    Args:
        passed: one bool per test.
        status: ``"ok"``, ``"timeout"``, ``"memory"``, ``"killed by SIG..."``, or
            ``"untrusted: <why>"`` (no verdict that can be believed came back).
        error: why the code did not load (``"ModuleNotFoundError: No module named 'numpy'"``),
            as the candidate's process reported it; ``""`` when it loaded.
    """

    passed: tuple[bool, ...]
    status: str
    error: str = ""

    @property
    def killed(self) -> bool:
        """No score: stopped by a limit or a signal, or the verdict cannot be trusted."""
        return self.status.startswith(KILLED) or self.status.startswith("killed")


def run_program(source: str, stdin: str = "", limits: Limits = Limits(), *, sandbox: str = "bwrap",
                python: str | None = None) -> ProgramResult:
    """Run ``source`` as ``__main__`` in the sandbox with ``stdin`` on its standard input.

    Args:
        source: the program's Python code.
        stdin: its standard input.
        limits: see `Limits`.
        sandbox: ``"bwrap"`` (raises `SandboxUnavailable` where bubblewrap is missing) or
            ``"local-unsafe"`` (rlimits only).
        python: the interpreter; by default the running one (installed packages import).

    Examples:
        >>> run_program("print(sum(map(int, input().split())))", "2 3").stdout
        '5\\n'
    """
    check_mode(sandbox, python)
    cap = int(limits.max_output_mb * (1 << 20))
    proc = Sandboxed("sandbox_inside.py", {"code": source, "limits": limits.inside()}, sandbox=sandbox,
                     file_bytes=limits.max_file_mb << 20, processes=limits.max_processes,
                     python=python or sys.executable, stdin=stdin.encode())
    try:
        out, err, status = proc.collect(time.monotonic() + limits.timeout + START_S, caps=(cap, 1 << 16))
    finally:
        proc.close()
    status = "memory" if status == f"exit {MEMORY_EXIT}" else status
    return ProgramResult(out.decode(errors="replace"), err.decode(errors="replace"), status)


def run_tests(code: str, tests: Sequence[str], limits: Limits = Limits(), *, sandbox: str = "bwrap",
              python: str | None = None) -> Outcome:
    """Load ``code`` in one sandbox and run each test against it from a clean one (see the module).

    Args:
        code: the candidate's Python code (run as a module named ``__solution__``).
        tests: Python snippets (``assert add(1, 2) == 3``; HumanEval's ``check(candidate)``
            program); each passes when it runs without raising. They share one namespace.
        limits: see `Limits`; ``timeout`` covers loading the code and all the tests.
        sandbox: ``"bwrap"`` or ``"local-unsafe"``.
        python: the interpreter; by default the running one.

    Examples:
        >>> run_tests("def add(a, b): return a + b", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"]).passed
        (True, False)
    """
    check_mode(sandbox, python)
    to_candidate, to_checker = os.pipe(), os.pipe()  # (read, write) each
    common = dict(sandbox=sandbox, file_bytes=limits.max_file_mb << 20, processes=limits.max_processes,
                  python=python or sys.executable)
    deadline = time.monotonic() + limits.timeout + START_S
    procs = []
    try:
        procs.append(Sandboxed("sandbox_candidate.py", {"code": code, "limits": limits.inside(), "requests_fd": to_candidate[0],
                                                        "replies_fd": to_checker[1]},
                               pass_fds=(to_candidate[0], to_checker[1]), capture=False, **common))
        procs.append(Sandboxed("sandbox_checker.py", {"tests": list(tests), "limits": limits.inside(),
                                                      "requests_fd": to_candidate[1], "replies_fd": to_checker[0]},
                               pass_fds=(to_candidate[1], to_checker[0]), **common))
        for fd in (*to_candidate, *to_checker):  # only the two sandboxes hold the pipes now
            os.close(fd)
        to_candidate = to_checker = ()
        candidate, checker = procs
        out, _, status = checker.collect(deadline, caps=(1 << 20, 1 << 16))
        ended = candidate.wait(min(deadline, time.monotonic() + 1.0))  # it exits once the checker is gone
        candidate.kill()
    finally:
        for fd in (*to_candidate, *to_checker):
            os.close(fd)
        for proc in procs:
            proc.kill()
            proc.close()
    return verdict(out, status, ended, len(tests))


def verdict(out: bytes, checker: str, candidate: str, n: int) -> Outcome:
    """The outcome from the checker's report and how both processes ended; anything but one
    well-formed report from a checker that ended normally is untrusted."""
    failed = (False,) * n
    if checker == "timeout" or candidate == "timeout" and checker != "ok":
        return Outcome(failed, "timeout")
    if candidate == f"exit {MEMORY_EXIT}":
        return Outcome(failed, "memory")
    if candidate.startswith("killed"):  # the CPU limit (SIGXCPU), or a signal it sent itself
        return Outcome(failed, candidate)
    if checker != "ok":
        return Outcome(failed, f"untrusted: the checker ended with {checker}")
    try:
        report = json.loads(out.decode())
        passed, error = report["passed"], report.get("error", "")
        assert set(report) <= {"passed", "error"} and type(passed) is list and len(passed) == n
        assert all(type(p) is bool for p in passed) and type(error) is str
    except (ValueError, KeyError, TypeError, AssertionError):
        return Outcome(failed, f"untrusted: malformed report {out[:80]!r}")
    return Outcome(tuple(passed), "ok", error[:1000])
