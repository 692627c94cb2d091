"""`pid_alive`: whether a process id names a process that still runs on this host. Shared by
the stale-temp cleanup of checkpoint saves (`checkpoint_io.clean_stale_temps`) and the test
cluster's teardown and sweep (``tests/netns_cluster.py``, which loads this file by its path so as
not to import torch: keep it to the standard library)."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host: signal 0 reaches it (ESRCH: gone), or it exists but is
    another user's (EPERM: alive), and it is not a zombie (ended, waiting for its parent to reap
    it: ``/proc/<pid>/stat`` says ``Z``; where there is no ``/proc`` a zombie reads alive). Zero
    and negative numbers name process groups, not a process: never alive.

    Examples:
        >>> pid_alive(os.getpid())
        True
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # ended since the signal; or a system without /proc
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]  # the name, in parentheses, may hold spaces and ")"
