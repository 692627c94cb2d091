"""A fresh ``pids`` cgroup per sandboxed process, where this process may create one (root).

``RLIMIT_NPROC`` does not bind processes whose real user is root, and in a user namespace
bubblewrap maps the sandbox's user to the caller's, so as root only a cgroup's ``pids.max``
bounds a fork bomb. Cgroup v1 (``/sys/fs/cgroup/pids/...``) and v2 (a delegated subtree with
the ``pids`` controller) are both tried once; without either, `new_pids_cgroup` returns None
and the rlimit is all there is (enough for a non-root trainer).
"""
from __future__ import annotations

import functools
import os
import signal
import time
import uuid


@functools.lru_cache(maxsize=1)
def pids_root() -> str | None:
    """A cgroup directory under which this process can create pids-limited children, or None."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    places = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            places.append("/sys/fs/cgroup/pids" + path)
        elif controllers == "":  # v2: the unified hierarchy
            places += ["/sys/fs/cgroup" + path, "/sys/fs/cgroup/unified" + path]
    for place in places:
        probe = os.path.join(place, f"rlpt-probe-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        usable = os.path.exists(os.path.join(probe, "pids.max"))
        os.rmdir(probe)
        if usable:
            return place
    return None


def new_pids_cgroup(processes: int) -> str | None:
    """A new cgroup whose ``pids.max`` is ``processes``, or None where none can be made."""
    root = pids_root()
    if root is None:
        return None
    path = os.path.join(root, f"rlpt-sandbox-{uuid.uuid4().hex}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(processes))
    except OSError:
        remove_cgroup(path)
        return None
    return path


def kill_cgroup(path: str) -> None:
    """SIGKILL every process in the cgroup."""
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = [int(p) for p in f.read().split()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_cgroup(path: str, wait_s: float = 2.0) -> None:
    """Remove the cgroup once its killed processes are gone (they leave it as they are reaped)."""
    end = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > end:
                return
            kill_cgroup(path)
            time.sleep(0.01)
