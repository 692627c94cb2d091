"""A launched vLLM server's guard: the server ends when the trainer that launched it ends.

`VLLMServer.start` runs this file as a script (standard library only, so it starts in
milliseconds and never imports torch)::

    python guard.py <trainer pid> [--remove DIR]... -- python -m vllm.entrypoints.openai.api_server ...

as the leader of a new session. The guard starts the server inside that session (vLLM's
api_server then spawns its EngineCore and workers there too) and polls its own parent: once the
trainer is gone, however it ended (SIGKILL, a scheduler's SIGTERM then SIGKILL, a crash), the
parent changes and the guard ends the whole session (SIGTERM and SIGCONT, so a stopped server
dies too; SIGKILL after ``GRACE`` seconds) and removes the ``--remove`` directories (the
launch checkpoint and the weight snapshots). A parent-death signal (``PR_SET_PDEATHSIG``) is
not used: it fires when the *thread* that started the child ends, not the process.

A SIGTERM sent to the whole group by `VLLMServer.stop` is caught here, so the guard lives until
the server has exited and `stop`'s wait on the guard covers the server's shutdown.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

POLL = 0.2  # seconds between looks at the parent
GRACE = 5.0  # seconds a server gets to exit on SIGTERM before the session is killed


def parse(argv: list[str]) -> tuple[int, list[str], list[str]]:
    """``(trainer pid, directories to remove, server command)`` from the guard's arguments."""
    if "--" not in argv or not argv:
        raise SystemExit("usage: guard.py <trainer pid> [--remove DIR]... -- <server command>")
    split = argv.index("--")
    head, command = argv[:split], argv[split + 1:]
    remove = [head[i + 1] for i, arg in enumerate(head) if arg == "--remove"]
    return int(head[0]), remove, command


def end_session(server: subprocess.Popen, remove: list[str]) -> None:
    """Stop every process of this session (the guard last) and remove the run's directories."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        os.killpg(0, sig)
    try:
        server.wait(timeout=GRACE)
    except subprocess.TimeoutExpired:
        pass
    for directory in remove:
        shutil.rmtree(directory, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)  # EngineCore and workers left by the api_server, and this guard


def main(argv: list[str]) -> int:
    parent, remove, command = parse(argv)
    if os.getsid(0) != os.getpid():  # started without a session of its own: never signal the trainer's group
        os.setsid()
    signal.signal(signal.SIGTERM, lambda *_: None)  # a handler (not SIG_IGN): the server does not inherit it
    server = subprocess.Popen(command)
    while True:
        try:
            code = server.wait(timeout=POLL)
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:  # the trainer is gone: this process was re-parented
                end_session(server, remove)
            continue
        os.killpg(0, signal.SIGTERM)  # the server exited (stopped or crashed): its children go too
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
