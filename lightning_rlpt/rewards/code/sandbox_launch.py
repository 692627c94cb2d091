"""Start one process in the sandbox and collect it (the trainer's side).

`Sandboxed` starts ``python -I <script> SPEC_FD`` under bubblewrap (``bwrap``): new user, PID,
network, IPC, UTS, mount and cgroup namespaces, no capabilities, no further user namespaces,
read-only binds of only ``/usr``, ``/lib*``, ``/bin`` and the interpreter's prefixes, its own
``/proc``, a read-only ``/dev``, a private ``/tmp`` tmpfs of ``max_file_mb`` (the bound on all
bytes written) as its working directory, a cleared environment, ``--new-session`` and
``--die-with-parent``. When bwrap's process ends, the kernel kills everything left in the PID
namespace, grandchildren in new sessions included. The interpreter is bound both where its path
says and where that path resolves to, so a virtualenv reached through a symlink runs. bwrap's
own child (the namespace's init) is reported on ``--json-status-fd``; when the trainer is PID 1
(a container without ``--init``) that child is reaped here, since nobody else would. With ``sandbox="local-unsafe"`` the same
script runs as a plain subprocess (own session, temporary directory, clean environment): a
best-effort mode for machines without bwrap. Where a ``pids`` cgroup is writable (root), each
process is started inside fresh ``pids`` and ``cpu`` cgroups (``sandbox_cgroup.py``: the
process count, and at most one CPU whatever it forks); the script sets its own rlimits.

`check_mode` starts one sandbox per interpreter before any code runs: a sandbox that cannot
start (bwrap missing or refused, the interpreter not visible inside, a cgroup refused) raises
`SandboxUnavailable` naming the cause and the fix, never a sample's score.

`Sandboxed.collect` reads standard output up to its cap (a process that writes more is killed)
and keeps the last part of standard error (the rest is read and dropped), waits until the
deadline, then kills and reaps.
"""
from __future__ import annotations

import functools
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

from ..calling import RewardError
from .sandbox_cgroup import kill_cgroup, new_cgroups, remove_cgroup

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ("sandbox_inside.py", "sandbox_codec.py", "sandbox_names.py", "sandbox_candidate.py", "sandbox_checker.py")
INSIDE = "/opt/rlpt"  # where the scripts are, inside the sandbox
MODES = ("bwrap", "local-unsafe")
INSTALL_HINT = ("bubblewrap's `bwrap` is not installed, and the code reward runs completions under it. Install the "
                "package: `apt-get install -y bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on Fedora), or "
                "pass sandbox='local-unsafe' to run code with rlimits only, which code written to escape gets past")
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


LAST_SIGNAL = 64  # SIGRTMAX on Linux: bwrap's 128 + N above it is a plain exit status
PROBE = "rlpt-sandbox-ok"


class SandboxUnavailable(RewardError):
    """The sandbox cannot start here (``bwrap`` missing or refused, the interpreter not visible
    inside, a cgroup refused): an infrastructure failure, raised whatever ``reward_on_error`` says,
    never a sample's score. The message names the cause and the fix."""


def check_mode(sandbox: str, python: str | None = None) -> None:
    """Refuse an unknown mode, or a sandbox that cannot start: ``"bwrap"`` where bubblewrap is
    missing, or any sandbox whose first (cached) trial run of ``python`` fails.

    Examples:
        >>> check_mode("local-unsafe")
    """
    if sandbox not in MODES:
        raise ValueError(f"sandbox must be one of {MODES} (got {sandbox!r})")
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        raise SandboxUnavailable(INSTALL_HINT)
    probe(sandbox, os.path.abspath(python or sys.executable))


@functools.lru_cache(maxsize=None)  # only a sandbox that started is remembered: a failure raises again
def probe(sandbox: str, python: str) -> None:
    """Start ``python`` in the sandbox once; `SandboxUnavailable` with bwrap's words when it cannot."""
    spec = {"code": f"print({PROBE!r})", "limits": {"memory_bytes": 1 << 30, "cpu_seconds": 30,
                                                    "file_bytes": 1 << 20, "processes": 16}}
    proc = Sandboxed("sandbox_inside.py", spec, sandbox=sandbox, file_bytes=1 << 20, processes=16, python=python)
    try:
        out, err, status = proc.collect(time.monotonic() + 30.0)
    finally:
        proc.close()
    if out.decode(errors="replace").strip() != PROBE:
        raise SandboxUnavailable(unavailable(sandbox, python, status, err.decode(errors="replace").strip()))


def unavailable(sandbox: str, python: str, status: str, err: str) -> str:
    """Why a trial run failed, and what to do about it."""
    said = f"a trial run of {python} in the {sandbox!r} sandbox ended with {status}: {err[-500:] or '(no message)'}"
    if "namespace" in err or "Operation not permitted" in err or "setting up uid map" in err:
        fix = ("bubblewrap may not create user namespaces here: run as root, enable unprivileged user namespaces "
               "(sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), "
               "or run the code on a service (RemoteCodeReward)")
    elif "cgroup" in err:
        fix = "a cgroup could not be joined: give this process a writable cgroup subtree, or run it as a non-root user"
    elif "execvp" in err or "No such file" in err:
        fix = ("the interpreter is not visible inside the sandbox: run the trainer with an interpreter under a real "
               "path (os.path.realpath(sys.executable)), or report the layout as a bug")
    else:
        fix = "check that this interpreter runs `python -I -c 'print(1)'` by itself"
    return f"the code sandbox cannot start, so no completion can be scored: {said}. Fix: {fix}"


def bind_views(paths) -> list[tuple[str, str]]:
    """``(source, destination)`` binds that make each path visible inside both where it says and
    where it resolves to (a virtualenv reached through a symlink, ``..`` in its path)."""
    binds = set()
    for path in paths:
        real, given = os.path.realpath(path), os.path.abspath(path)
        if real != "/" and not real.startswith("/usr/"):  # /usr is bound whole
            binds.add((real, real))
        if given != real and given != "/" and not given.startswith("/usr/"):  # a link under /usr resolves inside
            binds.add((real, given))
    return sorted(binds, key=lambda b: (b[1].count("/"), b))  # parents before children


def bwrap_argv(python: str, file_bytes: int) -> list[str]:
    """bubblewrap's command line up to the interpreter (see the module docstring)."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
            "--new-session", "--clearenv",
            # The private /tmp first: binds below land on top of it, so an interpreter or a
            # checkout that lives under the host's /tmp (a CI clone) is still visible inside.
            "--size", str(file_bytes), "--tmpfs", "/tmp"]
    for path in ("/usr", "/bin", "/lib", "/lib64", "/lib32"):
        argv += ["--ro-bind-try", path, path]
    prefixes = (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(python)),
                os.path.dirname(os.path.dirname(os.path.realpath(python))))
    for source, destination in bind_views(prefixes):
        argv += ["--ro-bind", source, destination]
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
        self.tmp, self.cgroups, self.status_fd, self.child = None, [], None, None
        self.bwrap = sandbox == "bwrap"
        python = os.path.abspath(python)
        status_w = None
        try:
            if sandbox == "bwrap":
                self.status_fd, status_w = os.pipe()  # bwrap writes its child's pid here (reaped if we are PID 1)
                os.set_blocking(self.status_fd, False)
                argv = bwrap_argv(python, file_bytes)
                argv[-1:-1] = ["--json-status-fd", str(status_w)]  # an option: before the interpreter
                argv, cwd = argv + ["-I", f"{INSIDE}/{script}", str(spec_fd)], "/"
                env, pass_fds = {}, (*pass_fds, status_w)
            else:
                self.tmp = tempfile.mkdtemp(prefix="rlpt-sandbox-")
                argv, cwd = [python, "-I", os.path.join(HERE, script), str(spec_fd)], self.tmp
                env = {**ENV, "HOME": self.tmp, "TMPDIR": self.tmp}
            self.cgroups = new_cgroups(processes)
            if self.cgroups:  # the shell joins the cgroups, then becomes the sandbox: nothing starts outside them
                join = 'for d in $0; do echo $$ > "$d/cgroup.procs" || { echo "cgroup $d refused" >&2; exit 97; }; done'
                argv = ["/bin/sh", "-c", join + '; exec "$@"', " ".join(self.cgroups)] + argv
            out = subprocess.PIPE if capture else subprocess.DEVNULL
            self.proc = subprocess.Popen(argv, stdin=in_fd, stdout=out, stderr=out, cwd=cwd, env=env,
                                         pass_fds=(spec_fd, *pass_fds), start_new_session=True)
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (spec_fd, in_fd, status_w):
                if fd is not None:
                    os.close(fd)

    def collect(self, deadline: float, caps: tuple[int, int] = (1 << 20, 1 << 16)) -> tuple[bytes, bytes, str]:
        """Standard output (up to its cap), the last part of standard error (up to its cap; the
        rest is read and dropped) and how the process ended: ``"ok"``, ``"exit N"``,
        ``"killed by SIG..."``, ``"timeout"`` (past ``deadline``, a ``time.monotonic()`` value) or
        ``"output"`` (wrote more standard output than its cap; killed)."""
        pipes = [p for p in (self.proc.stdout, self.proc.stderr) if p]
        data = {p.fileno(): bytearray() for p in pipes}
        cap = {p.fileno(): c for p, c in zip((self.proc.stdout, self.proc.stderr), caps) if p}
        err_fd = self.proc.stderr.fileno() if self.proc.stderr else None
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
                elif len(data[fd]) > cap[fd] and fd == err_fd:
                    del data[fd][:-cap[fd]]  # standard error: keep its last part, never kill for it
                elif len(data[fd]) > cap[fd]:
                    status = "output"  # never read more standard output than the cap: kill the writer
        status = status or self.wait(deadline)
        self.kill()
        out = bytes(data[self.proc.stdout.fileno()][:caps[0]]) if self.proc.stdout else b""
        err = bytes(data[err_fd]) if err_fd is not None else b""
        return out, err, status

    def wait(self, deadline: float) -> str:
        """How the process ended, or ``"timeout"`` if it still runs at ``deadline``."""
        try:
            code = self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return "timeout"
        if self.bwrap and 128 < code <= 128 + LAST_SIGNAL:  # bwrap exits 128 + N when its child was killed by signal N
            code = 128 - code  # (an exit status in that range reads as the signal: no way to tell them apart)
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:  # a real-time signal has no name
                return f"killed by signal {-code}"
        return "ok" if code == 0 else f"exit {code}"

    def kill(self) -> None:
        """Kill the process and everything it started (its session, and its cgroup)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for cgroup in self.cgroups:
            kill_cgroup(cgroup)
        self.proc.wait()
        self.reap_child()

    def reap_child(self) -> None:
        """Reap bwrap's child (the sandbox's init) when it was left to us: a trainer that is PID 1
        inherits the orphans of the processes it kills, and only it can reap them."""
        if self.status_fd is None or os.getpid() != 1:
            return
        if self.child is None:
            try:
                status = os.read(self.status_fd, 4096).split(b"\n", 1)[0]
                self.child = int(json.loads(status)["child-pid"])
            except (OSError, ValueError, KeyError, TypeError):
                return  # bwrap died before it started a child
        end = time.monotonic() + 2.0
        while time.monotonic() < end:  # SIGKILLed with its parent (--die-with-parent): it goes at once
            try:
                if os.waitpid(self.child, os.WNOHANG)[0]:
                    return
            except ChildProcessError:
                return  # not ours, or already reaped
            time.sleep(0.005)

    def close(self) -> None:
        """Remove the cgroups, the temporary directory and the pipes."""
        for cgroup in self.cgroups:
            remove_cgroup(cgroup)
        if self.status_fd is not None:
            os.close(self.status_fd)
            self.status_fd = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        for pipe in (getattr(self, "proc", None) and (self.proc.stdout, self.proc.stderr)) or ():
            if pipe:
                pipe.close()
