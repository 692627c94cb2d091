"""The program the code sandbox runs: ``python -I sandbox_child.py`` with a JSON spec on stdin.

It is a supervisor that forks one worker. The worker sets its resource limits, runs the
completion's code and then each test, and reports ``<nonce> <test> <0|1>`` lines on a private
pipe. The supervisor enforces the wall-clock timeout, kills and reaps every process the worker
left behind (it is a child subreaper, so orphans come back to it even when the container's PID
1 does not reap them), and prints one JSON line for the parent: the tests that passed, how the
worker ended and which network protection held. Standard library only; never imported by the
package (`lightning_rlpt.rewards.sandbox` starts it).
"""
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_CHILD_SUBREAPER = 36
MEMORY_EXIT = 3  # the worker's exit status after a MemoryError
MAX_REPORT = 1 << 20  # bytes of report read from the worker; the rest is dropped


def isolate_network(mode: str) -> str:
    """A fresh network namespace (only a downed loopback) when the kernel allows it, else 'guard'."""
    if mode == "auto":
        libc = ctypes.CDLL(None, use_errno=True)
        # As root a plain network namespace; unprivileged, inside a new user namespace.
        if libc.unshare(CLONE_NEWNET) == 0 or libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            return "namespace"
    return "guard"


def guard_sockets() -> None:
    """Best effort where no namespace is available: Python refuses non-Unix sockets. Code that
    calls the C library directly (ctypes) gets past this; a namespace does not let it."""
    import _socket
    import socket

    class NoNetwork(socket.socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None and family != socket.AF_UNIX:
                raise PermissionError("network access is disabled in the sandbox")
            super().__init__(family, type, proto, fileno)

    socket.socket = socket.SocketType = _socket.socket = _socket.SocketType = NoNetwork


def set_limits(spec: dict) -> None:
    mem, cpu, fsize = spec["memory_bytes"], spec["cpu_seconds"], spec["file_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file limit fails, not the process


def worker(spec: dict, report_fd: int, guard: bool) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the code's output goes nowhere; the parent's pipes are out of its reach
        os.dup2(devnull, fd)
    set_limits(spec)
    if guard:
        guard_sockets()
    report = os.fdopen(report_fd, "w", buffering=1)
    nonce, code, tests = spec["nonce"], spec["code"], spec["tests"]
    del spec
    namespace = {"__name__": "__solution__", "__builtins__": __builtins__}

    def run(source: str, name: str) -> bool:
        try:
            exec(compile(source, name, "exec"), namespace)
            return True
        except MemoryError:
            report.write(f"{nonce} memory\n")
            report.flush()
            os._exit(MEMORY_EXIT)
        except BaseException:  # SystemExit and KeyboardInterrupt included: the test failed
            return False

    loaded = run(code, "<completion>")
    for i, test in enumerate(tests):
        ok = loaded and run(test, f"<test {i}>")
        report.write(f"{nonce} {i} {int(ok)}\n")
    report.write(f"{nonce} done\n")
    report.flush()
    os._exit(0)


def supervise(pid: int, report_fd: int, timeout: float) -> tuple[bytes, str]:
    """The worker's report and how it ended: ok, exit N, memory, timeout or killed by a signal."""
    deadline, report, status, eof = time.monotonic() + timeout, bytearray(), None, False
    while status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
            break
        if eof:  # the worker closed the pipe but runs on: poll
            time.sleep(min(left, 0.02))
        elif select.select([report_fd], [], [], min(left, 0.05))[0]:
            chunk = os.read(report_fd, 65536)
            eof = not chunk
            report += chunk[:max(0, MAX_REPORT - len(report))]
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            status = ended(wait_status)
    os.set_blocking(report_fd, False)
    while len(report) < MAX_REPORT:  # what the worker wrote just before it ended
        try:
            chunk = os.read(report_fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        report += chunk
    return bytes(report), status


def ended(wait_status: int) -> str:
    if os.WIFSIGNALED(wait_status):
        return f"killed by {signal.Signals(os.WTERMSIG(wait_status)).name}"  # SIGXCPU: the CPU limit
    code = os.WEXITSTATUS(wait_status)
    return "ok" if code == 0 else f"exit {code}"


def reap_everything() -> None:
    """Kill and reap every process the worker left, escaped sessions included (they are ours)."""
    me = os.getpid()
    path = f"/proc/{me}/task/{me}/children"
    while os.path.exists(path):
        with open(path) as f:
            kids = [int(p) for p in f.read().split()]
        if not kids:
            return
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for kid in kids:
            try:
                os.waitpid(kid, 0)
            except ChildProcessError:
                pass


def main() -> None:
    spec = json.loads(sys.stdin.read())
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    network = isolate_network(spec["network"])
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        worker(spec, write_fd, guard=network == "guard")
    os.close(write_fd)
    report, status = supervise(pid, read_fd, spec["timeout"])
    reap_everything()
    passed, said = {}, set()
    for line in report.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == spec["nonce"] and parts[1].isdigit():
            passed[int(parts[1])] = parts[2] == "1"
        elif len(parts) == 2 and parts[0] == spec["nonce"]:
            said.add(parts[1])
    if status == "ok" and "done" not in said:  # the code ended the process itself (os._exit(0))
        status = "exit 0"
    elif status == f"exit {MEMORY_EXIT}" and "memory" in said:
        status = "memory"
    print(json.dumps({"passed": [passed.get(i, False) for i in range(len(spec["tests"]))], "status": status,
                      "network": network}))


if __name__ == "__main__":
    main()
