"""A run's own scratch folder (weight snapshots, LoRA adapters), removed however the run ends.

`owned_folder(parent, prefix)` makes ``<parent>/<prefix><host>-<pid>-XXXXXXXX`` and

- holds an exclusive ``flock`` on its ``.owner`` file for as long as this process lives (the
  kernel drops it however the process ends);
- starts a janitor, the launched servers' guard (``guard.py``) around ``sleep infinity`` in a
  session of its own: once this process is gone, whatever ended it (SIGKILL, a scheduler's
  SIGTERM where no handler is set, torchrun's SIGKILL after its grace period), the janitor
  removes the folder within its poll interval (0.2 s);
- first removes what dead runs left in ``parent``: ``prefix`` folders whose ``.owner`` lock is
  free (their process and its janitor were both killed, e.g. with a job's whole cgroup), each
  named in a warning. Folders without an ``.owner`` file (older versions) are left alone.

`release` removes the folder and stops its janitor (``close``: the normal and the exception
paths); an ``atexit`` hook releases whatever is left when the interpreter exits (Lightning turns
SIGTERM and SIGINT into ``SystemExit``).
"""
from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

log = logging.getLogger(__name__)
GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard.py")
OWNER = ".owner"
_OWNED: dict[str, tuple[int, subprocess.Popen]] = {}


def owned_folder(parent: str, prefix: str, what: str = "scratch directory") -> str:
    """A new folder of this process's own under ``parent`` (see the module docstring)."""
    parent, host = os.path.abspath(parent), socket.gethostname()
    try:
        os.makedirs(parent, exist_ok=True)
        path = tempfile.mkdtemp(prefix=f"{prefix}{host}-{os.getpid()}-", dir=parent)
        # Locked before it is named .owner: a sweep never sees this folder's owner file unlocked.
        fd = os.open(os.path.join(path, OWNER + ".new"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ValueError(f"cannot write the {what} {parent} on host {host} ({err.strerror}): choose a directory "
                         "this host can write (for vLLM servers on other hosts: a shared filesystem mounted at the "
                         "same path on every host)") from err
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"host {host} pid {os.getpid()}\n".encode())
    os.rename(os.path.join(path, OWNER + ".new"), os.path.join(path, OWNER))
    remove_leftovers(parent, prefix)
    janitor = subprocess.Popen([sys.executable, GUARD, str(os.getpid()), "--remove", path, "--", "sleep", "infinity"],
                               start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    if not _OWNED:
        atexit.register(release_all)
    _OWNED[path] = (fd, janitor)
    return path


def remove_leftovers(parent: str, prefix: str) -> list[str]:
    """Remove ``prefix`` folders in ``parent`` whose owner is gone (free ``.owner`` lock); returns them."""
    removed = []
    for name in sorted(os.listdir(parent)):
        folder = os.path.join(parent, name)
        if not name.startswith(prefix) or folder in _OWNED:
            continue
        try:
            fd = os.open(os.path.join(folder, OWNER), os.O_RDONLY)
        except OSError:
            continue  # no owner file: not made here, or by an older version
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its run is alive
        who = os.read(fd, 200).decode(errors="replace").strip()
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
        log.warning("removed %s, left by a run that ended without removing it (%s; killed with its janitor?)",
                    folder, who)
        removed.append(folder)
    return removed


def release(path: str) -> None:
    """Remove ``path`` and stop its janitor (any folder: one not made by `owned_folder` is just removed)."""
    fd, janitor = _OWNED.pop(path, (None, None))
    shutil.rmtree(path, ignore_errors=True)
    if janitor is not None:
        try:  # the guard ignores SIGTERM; its sleep ends, then the guard (the folder is already gone)
            os.killpg(janitor.pid, signal.SIGTERM)
            janitor.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(janitor.pid, signal.SIGKILL)
    if fd is not None:
        os.close(fd)


def release_all() -> None:
    for path in list(_OWNED):
        release(path)
