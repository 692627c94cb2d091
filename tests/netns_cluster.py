"""A test cluster on one machine: Linux network namespaces as hosts, joined by a bridge.

Each host is a network namespace with its own stack, loopback and address (10.<net>.0.<i>/24),
joined by a veth pair to a bridge that lives in a namespace of its own (the switch), so the
machine's own network is never touched. Processes run on a host through ``ip netns exec``; a
link is cut with ``ip link set ... down`` on the switch side of the host's veth.

Everything is named ``rlpt<pid>-*`` after the process that built it. `Cluster.close` stops each
process left in a host by its PID (``ip netns pids``), then deletes the namespaces (their veths
go with them); `sweep` removes what a killed run left behind (names whose PID is gone).

Needs root and iproute2 (``ip netns``). `Cluster.unavailable` says why a cluster cannot be built
here and how to run it, for pytest's skip.

By hand (as root)::

    python tests/netns_cluster.py up trainer0 trainer1 rollout0     # prints each host's address
    ip netns exec rlpt<pid>-trainer0 ping -c1 10.<net>.0.3
    python tests/netns_cluster.py down                               # removes every rlpt* namespace
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Sequence

PREFIX = "rlpt"


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """Every network namespace on the machine (``ip netns list`` prints ``name (id: n)``)."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_pids(pids: Sequence[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever is still there after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)


def delete_namespace(name: str) -> None:
    """Stop every process inside ``name`` by PID, then delete it (its veth ends go with it)."""
    pids = [int(p) for p in _ip("netns", "pids", name, check=False).split()]
    _stop_pids(pids)
    _ip("netns", "del", name, check=False)


def sweep() -> list[str]:
    """Delete the namespaces of earlier runs whose building process is gone; returns their names."""
    gone = []
    for name in namespaces():
        owner = name[len(PREFIX):].split("-", 1)[0]
        if name.startswith(PREFIX) and owner.isdigit() and not _alive(int(owner)):
            delete_namespace(name)
            gone.append(name)
    return gone


class Cluster:
    """Hosts (network namespaces) on one bridge. Use as a context manager, or call `close`.

    Args:
        hosts: host names, e.g. ``["trainer0", "trainer1", "rollout0"]``; each gets an address
            in order (``10.<net>.0.1``, ``.2``, ...).
        net: the second octet of the addresses (default: from the PID, so two runs differ).
    """

    def __init__(self, hosts: Sequence[str], net: int | None = None):
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"host names must be distinct and at least one, got {list(hosts)}")
        self.tag = f"{PREFIX}{os.getpid()}"
        self.net = 100 + os.getpid() % 100 if net is None else net
        self.switch = f"{self.tag}-sw"
        self.hosts = {h: f"10.{self.net}.0.{i + 1}" for i, h in enumerate(hosts)}
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def unavailable() -> str | None:
        """Why a cluster cannot be built here (None when it can), with how to make it possible."""
        if shutil.which("ip") is None:
            return "iproute2's `ip` is not installed (apt-get install iproute2; `make install` does it as root)"
        if os.geteuid() != 0:
            return "network namespaces need root: run the multi-host tests as root (CI does)"
        probe = f"{PREFIX}{os.getpid()}-probe"
        done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
        if done.returncode:
            return f"`ip netns add` failed here ({done.stderr.strip()}): the container lacks CAP_SYS_ADMIN"
        _ip("netns", "del", probe, check=False)
        return None

    def namespace(self, host: str) -> str:
        if host not in self.hosts:
            raise KeyError(f"no host {host!r} in this cluster (hosts: {sorted(self.hosts)})")
        return f"{self.tag}-{host}"

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (host, address) in enumerate(self.hosts.items()):
            ns = self.namespace(host)
            self._add_namespace(ns)
            # Both ends are made in the switch, then one is moved: names only need to be unique there.
            _ip("-n", self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0")
            _ip("-n", self.switch, "link", "set", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``host``: the ``ip netns exec`` prefix added."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def popen(self, host: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on ``host`` in a session of its own (so its whole group can be signalled)."""
        return subprocess.Popen(self.command(host, argv), start_new_session=True, **kwargs)

    def run(self, host: str, argv: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, argv), timeout=timeout, capture_output=True, text=True, **kwargs)

    def set_link(self, host: str, up: bool) -> None:
        """Cut (or restore) ``host``'s link at the switch: its processes live on, unreachable."""
        index = list(self.hosts).index(host)
        _ip("-n", self.switch, "link", "set", f"p{index}", "up" if up else "down")

    def blackhole(self, host: str, address: str) -> None:
        """Drop, inside ``host``, every packet to ``address``: that host alone cannot reach it."""
        _ip("-n", self.namespace(host), "route", "add", "blackhole", f"{address}/32")

    def pids(self, host: str) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", self.namespace(host), check=False).split()]

    def close(self) -> None:
        """Stop every process on every host by PID and delete the namespaces; safe to call twice."""
        for name in reversed(self._made):
            delete_namespace(name)
        self._made.clear()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in ("up", "down"):
        print(__doc__)
        return 2
    if argv[0] == "down":
        for name in namespaces():
            if name.startswith(PREFIX):
                delete_namespace(name)
                print("deleted", name)
        return 0
    why = Cluster.unavailable()
    if why:
        print(f"cannot build a cluster here: {why}", file=sys.stderr)
        return 1
    cluster = Cluster(argv[1:] or ["trainer0", "trainer1", "rollout0"])
    for host, address in cluster.hosts.items():
        print(f"{host}\t{cluster.namespace(host)}\t{address}")
    print("left running; `python tests/netns_cluster.py down` removes it")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
