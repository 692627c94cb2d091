"""Fresh cgroups per sandboxed process, where this process may create them (root): ``pids`` and ``cpu``.

- ``pids``: ``RLIMIT_NPROC`` does not bind processes whose real user is root, and in a user
  namespace bubblewrap maps the sandbox's user to the caller's, so as root only a cgroup's
  ``pids.max`` bounds a fork bomb.
- ``cpu``: without it the kernel shares the CPU per session (autogroups), so one completion that
  forks spinners which each call ``setsid()`` starves an honest neighbour into a timeout. In its
  own cpu cgroup a sandbox gets at most one CPU (``cpu.max`` / ``cpu.cfs_quota_us``) and an
  equal weight, whatever it forks.

Cgroup v1 (``/sys/fs/cgroup/<controller>/...``) and v2 (a delegated subtree with the controller
enabled) are both tried once per controller; where neither can be written, that controller is
skipped and the rlimits are all there is (enough for a non-root trainer).
"""
from __future__ import annotations

import functools
import os
import signal
import time
import uuid

CONTROLLERS = {"pids": "pids.max", "cpu": ("cpu.max", "cpu.cfs_quota_us")}


@functools.lru_cache(maxsize=None)
def controller_root(controller: str) -> str | None:
    """A cgroup directory under which this process can create children with ``controller``, or None."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    places = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            places.append(f"/sys/fs/cgroup/{controllers}" + path)
        elif controllers == "":  # v2: the unified hierarchy
            places += ["/sys/fs/cgroup" + path, "/sys/fs/cgroup/unified" + path]
    files = CONTROLLERS[controller]
    for place in places:
        probe = os.path.join(place, f"rlpt-probe-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        usable = any(os.path.exists(os.path.join(probe, name)) for name in (files if isinstance(files, tuple) else (files,)))
        os.rmdir(probe)
        if usable:
            return place
    return None


def new_cgroups(processes: int) -> list[str]:
    """New cgroups for one sandbox: ``pids.max`` = ``processes``, at most one CPU; one directory
    per hierarchy (v1 has one per controller, v2 one for both); [] where none can be made."""
    made: dict[str, str] = {}
    try:
        for controller in CONTROLLERS:
            root = controller_root(controller)
            if root is None:
                continue
            path = made.get(root) or os.path.join(root, f"rlpt-sandbox-{uuid.uuid4().hex}")
            if root not in made:
                os.mkdir(path)
                made[root] = path
            limit(path, controller, processes)
    except OSError:
        for path in made.values():
            remove_cgroup(path)
        return []
    return list(made.values())


def limit(path: str, controller: str, processes: int) -> None:
    """Write one controller's limit into the cgroup at ``path``."""
    if controller == "pids":
        write(path, "pids.max", processes)
    elif os.path.exists(os.path.join(path, "cpu.max")):  # v2: quota and period in one file
        write(path, "cpu.max", "100000 100000")
    else:
        write(path, "cpu.cfs_period_us", 100000)
        write(path, "cpu.cfs_quota_us", 100000)


def write(path: str, name: str, value) -> None:
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


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
