"""What every sandboxed process does first, and the runner of stdin/stdout programs.

Run inside the sandbox as ``python -I sandbox_inside.py SPEC_FD`` (a program read from its
standard input and writing to its standard output), and imported by ``sandbox_candidate.py``
and ``sandbox_checker.py``. The spec is JSON on an inherited file descriptor, so standard input
stays the program's. Standard library only; importing it has no effect.
"""
import json
import os
import resource
import signal
import sys

MEMORY_EXIT = 3  # the exit status after a MemoryError: the parent reports "memory"


def read_spec(argv) -> dict:
    """The JSON spec on the file descriptor named by ``argv[1]`` (closed after reading)."""
    with os.fdopen(int(argv[1]), "rb") as f:
        return json.loads(f.read())


def apply_limits(limits: dict) -> None:
    """The rlimits of this process and all it starts: address space, CPU seconds, file size,
    process count, no core files. The sandbox cannot raise them again (no capabilities)."""
    mem, cpu, fsize = limits["memory_bytes"], limits["cpu_seconds"], limits["file_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file limit fails, not the process


def silence(*fds: int) -> None:
    """Point ``fds`` at /dev/null."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)


def run_program(spec: dict) -> None:
    """Run the spec's code as ``__main__`` with this process's standard input and output."""
    apply_limits(spec["limits"])
    code = spec["code"]
    del spec
    try:
        exec(compile(code, "<program>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except MemoryError:
        os._exit(MEMORY_EXIT)
    except SystemExit as end:
        sys.stdout.flush()
        raise end
    sys.stdout.flush()


if __name__ == "__main__":
    run_program(read_spec(sys.argv))
