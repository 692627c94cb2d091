"""Start one process in the sandbox and collect it (the trainer's side).

`Sandboxed` starts ``python -I <script> SPEC_FD`` under bubblewrap (``bwrap``): new user, PID,
network, IPC, UTS, mount and cgroup namespaces, no capabilities, no further user namespaces,
read-only binds of only ``/usr``, ``/lib*``, ``/bin`` and the interpreter's prefixes, its own
``/proc``, a read-only ``/dev``, a private ``/tmp`` tmpfs of ``max_file_mb`` (the bound on all
bytes written) as its working directory, a cleared environment, ``--new-session`` and
``--die-with-parent``. When bwrap's process ends, the kernel kills everything left in the PID
namespace, grandchildren in new sessions included. With ``sandbox="local-unsafe"`` the same
script runs as a plain subprocess (own session, temporary directory, clean environment): a
best-effort mode for machines without bwrap. Where a ``pids`` cgroup is writable (root), each
process is started inside a fresh one whose ``pids.max`` bounds the process count
(``RLIMIT_NPROC`` does not bind root); the script sets its own rlimits.

`Sandboxed.collect` reads standard output and error up to their caps (a process that writes
more is killed), waits until the deadline, then kills and reaps.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from .sandbox_cgroup import kill_cgroup, new_pids_cgroup, remove_cgroup

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ("sandbox_inside.py", "sandbox_codec.py", "sandbox_candidate.py", "sandbox_checker.py")
INSIDE = "/opt/rlpt"  # where the scripts are, inside the sandbox
MODES = ("bwrap", "local-unsafe")
INSTALL_HINT = ("bubblewrap's `bwrap` is not installed, and the code reward runs completions under it. Install the "
                "package: `apt-get install -y bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on Fedora), or "
                "pass sandbox='local-unsafe' to run code with rlimits only, which code written to escape gets past")
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


class SandboxUnavailable(RuntimeError):
    """The sandbox asked for cannot run here (``bwrap`` missing or refused); the message says what to install."""


def check_mode(sandbox: str) -> None:
    """Refuse an unknown mode, or ``"bwrap"`` where bubblewrap is missing.

    Example:
        >>> check_mode("local-unsafe")
    """
    if sandbox not in MODES:
        raise ValueError(f"sandbox must be one of {MODES} (got {sandbox!r})")
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        raise SandboxUnavailable(INSTALL_HINT)


def bwrap_argv(python: str, file_bytes: int) -> list[str]:
    """bubblewrap's command line up to the interpreter (see the module docstring)."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
            "--new-session", "--clearenv",
            # The private /tmp first: binds below land on top of it, so an interpreter or a
            # checkout that lives under the host's /tmp (a CI clone) is still visible inside.
            "--size", str(file_bytes), "--tmpfs", "/tmp"]
    for path in ("/usr", "/bin", "/lib", "/lib64", "/lib32"):
        argv += ["--ro-bind-try", path, path]
    for prefix in sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(python)))}):
        if prefix != "/" and not prefix.startswith("/usr/"):
            argv += ["--ro-bind", prefix, prefix]
    for name in SCRIPTS:
        argv += ["--ro-bind", os.path.join(HERE, name), f"{INSIDE}/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev", "--chdir", "/tmp"]
    for key, value in {**ENV, "HOME": "/tmp", "TMPDIR": "/tmp"}.items():
        argv += ["--setenv", key, value]
    return argv + [python]


def memfd(data: bytes) -> int:
    """An anonymous file holding ``data``, read from its start (inheritable)."""
    fd = os.memfd_create("rlpt-sandbox", 0)
    os.write(fd, data)  # a memfd takes the whole write
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Sandboxed:
    """One sandboxed process running one of `SCRIPTS`.

    Args:
        script: the script's file name.
        spec: JSON-ready dict handed to it on an inherited file descriptor (``limits`` inside).
        sandbox: ``"bwrap"`` or ``"local-unsafe"``.
        file_bytes: bytes the process may write (the tmpfs size; per file when local-unsafe).
        processes: processes it may run at once (a pids cgroup where writable, else ``RLIMIT_NPROC``).
        python: the interpreter.
        pass_fds: more descriptors it inherits (the pipes between candidate and checker).
        stdin: bytes on its standard input.
        capture: read its standard output and error (else they go to /dev/null).
    """

    def __init__(self, script: str, spec: dict, *, sandbox: str, file_bytes: int, processes: int, python: str,
                 pass_fds: Sequence[int] = (), stdin: bytes = b"", capture: bool = True):
        spec_fd, in_fd = memfd(json.dumps(spec).encode()), memfd(stdin)
        self.tmp = self.cgroup = None
        self.bwrap = sandbox == "bwrap"
        try:
            if sandbox == "bwrap":
                argv, cwd = bwrap_argv(python, file_bytes) + ["-I", f"{INSIDE}/{script}", str(spec_fd)], "/"
                env = {}
            else:
                self.tmp = tempfile.mkdtemp(prefix="rlpt-sandbox-")
                argv, cwd = [python, "-I", os.path.join(HERE, script), str(spec_fd)], self.tmp
                env = {**ENV, "HOME": self.tmp, "TMPDIR": self.tmp}
            self.cgroup = new_pids_cgroup(processes)
            if self.cgroup:  # the shell joins the cgroup, then becomes the sandbox: nothing starts outside it
                argv = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.cgroup] + argv
            out = subprocess.PIPE if capture else subprocess.DEVNULL
            self.proc = subprocess.Popen(argv, stdin=in_fd, stdout=out, stderr=out, cwd=cwd, env=env,
                                         pass_fds=(spec_fd, *pass_fds), start_new_session=True)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(spec_fd)
            os.close(in_fd)

    def collect(self, deadline: float, caps: tuple[int, int] = (1 << 20, 1 << 16)) -> tuple[bytes, bytes, str]:
        """Standard output and error (each up to its cap) and how the process ended: ``"ok"``,
        ``"exit N"``, ``"killed by SIG..."``, ``"timeout"`` (past ``deadline``, a
        ``time.monotonic()`` value) or ``"output"`` (wrote more than a cap; killed)."""
        pipes = [p for p in (self.proc.stdout, self.proc.stderr) if p]
        data = {p.fileno(): bytearray() for p in pipes}
        cap = {p.fileno(): c for p, c in zip((self.proc.stdout, self.proc.stderr), caps) if p}
        open_fds, status = list(data), None
        while open_fds and status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            for fd in select.select(open_fds, [], [], left)[0]:
                chunk = os.read(fd, 65536)
                data[fd] += chunk
                if not chunk:
                    open_fds.remove(fd)
                elif len(data[fd]) > cap[fd]:
                    status = "output"  # never read more than the cap: kill the writer
        status = status or self.wait(deadline)
        self.kill()
        out, err = (bytes(data[p.fileno()][:cap[p.fileno()]]) if p else b"" for p in (self.proc.stdout, self.proc.stderr))
        return out, err, status

    def wait(self, deadline: float) -> str:
        """How the process ended, or ``"timeout"`` if it still runs at ``deadline``."""
        try:
            code = self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return "timeout"
        if self.bwrap and code > 128:  # bwrap exits 128 + N when its child was killed by signal N
            code = 128 - code
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return "ok" if code == 0 else f"exit {code}"

    def kill(self) -> None:
        """Kill the process and everything it started (its session, and its cgroup)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.cgroup:
            kill_cgroup(self.cgroup)
        self.proc.wait()

    def close(self) -> None:
        """Remove the cgroup and the temporary directory."""
        if self.cgroup:
            remove_cgroup(self.cgroup)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        for pipe in (getattr(self, "proc", None) and (self.proc.stdout, self.proc.stderr)) or ():
            if pipe:
                pipe.close()
