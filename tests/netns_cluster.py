"""A test cluster on one machine: Linux network namespaces as hosts, joined by a bridge.

Each host is a network namespace with its own stack, loopback and address (10.<net>.0.<i>/24),
joined by a veth pair to a bridge that lives in a namespace of its own (the switch), so the
machine's own network is never touched. Processes run on a host through ``ip netns exec``; a
link is cut with ``ip link set ... down`` on the switch side of the host's veth.

A cluster has an owner. Its builder picks a token (``c`` and 8 hex digits) and holds an
exclusive ``flock`` on ``/run/rlpt-clusters/<token>.lock`` for the cluster's life; its namespaces
are named ``rlpt<token>-<host>``. The lock is taken before the first namespace is made and
released after the last is deleted, so a namespace whose lock is free (or absent) belongs to
nobody: `sweep` deletes exactly those, and a concurrent run's clusters, or one a user keeps with
``up``, are left alone. `Cluster.close` stops each process left in a host by its PID
(``ip netns pids``), deletes the namespaces (their veths go with them), then releases the lock.
Names from before tokens (``rlpt<pid>-``) are swept when that PID is gone.

Needs root and iproute2 (``ip netns``). `Cluster.unavailable` says why a cluster cannot be built
here and how to run it, for pytest's skip.

By hand (as root)::

    python tests/netns_cluster.py up trainer0 trainer1 rollout0   # prints the token, each host's address
    ip netns exec rlpt<token>-trainer0 ping -c1 10.<net>.0.3
    python tests/netns_cluster.py down <token>                     # removes that cluster only
    python tests/netns_cluster.py list                             # every cluster, held or free

``up`` leaves a keeper process (``sleep infinity``, its PID in the lock file) holding the lock,
so that no sweep takes the cluster while it is in use; ``down TOKEN`` stops it.
"""
from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import zlib
from typing import Sequence

PREFIX = "rlpt"
LOCKS = "/run/rlpt-clusters"  # a tmpfs, like /run/netns: cleared with the namespaces at boot


def _load_pid_alive():
    """`lightning_rlpt.processes.pid_alive`, loaded by its file: importing the package would import
    torch and Lightning (seconds) in every ``python tests/netns_cluster.py`` and sweep process."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lightning_rlpt", "processes.py")
    spec = importlib.util.spec_from_file_location("_rlpt_processes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pid_alive


pid_alive = _load_pid_alive()


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """Every network namespace on the machine (``ip netns list`` prints ``name (id: n)``)."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _stop_pids(pids: Sequence[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever is still there after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)


def delete_namespace(name: str) -> None:
    """Stop every process inside ``name`` by PID, then delete it (its veth ends go with it)."""
    pids = [int(p) for p in _ip("netns", "pids", name, check=False).split()]
    _stop_pids(pids)
    _ip("netns", "del", name, check=False)


def lock_path(token: str) -> str:
    return os.path.join(LOCKS, f"{token}.lock")


def take_lock(token: str) -> int | None:
    """The fd holding ``token``'s lock (created if absent), or None while another process holds it."""
    os.makedirs(LOCKS, exist_ok=True)
    while True:
        fd = os.open(lock_path(token), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(lock_path(token)).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # a sweep released (unlinked) the file between our open and lock: take the new one


def release_lock(token: str, fd: int) -> None:
    """Unlink while holding, then close: nobody can lock the old file and believe it current."""
    try:
        os.unlink(lock_path(token))
    except FileNotFoundError:
        pass
    os.close(fd)


def clusters() -> dict[str, list[str]]:
    """token -> its namespaces, for every ``rlpt<token>-*`` namespace on the machine."""
    found: dict[str, list[str]] = {}
    for name in namespaces():
        if name.startswith(PREFIX) and "-" in name:
            found.setdefault(name[len(PREFIX):].split("-", 1)[0], []).append(name)
    return found


def owner(token: str) -> dict:
    """What the lock file says of its holder (``{"pid": ..., "keeper": ..., "hosts": ...}``), {} if nothing."""
    try:
        with open(lock_path(token)) as f:
            return json.loads(f.read() or "{}")
    except (FileNotFoundError, ValueError):
        return {}


def sweep() -> list[str]:
    """Delete the namespaces of clusters nobody holds (their builder is gone); returns their names."""
    gone = []
    for token, names in clusters().items():
        if token.isdigit():  # named after its builder's PID (before tokens): gone when that PID is
            if not pid_alive(int(token)):
                for name in names:
                    delete_namespace(name)
                gone += names
            continue
        fd = take_lock(token)
        if fd is None:
            continue  # held: a live run's, or one kept by `up`
        try:
            for name in clusters().get(token, []):  # read again under the lock
                delete_namespace(name)
                gone.append(name)
        finally:
            release_lock(token, fd)
    return gone


def down(token: str) -> list[str]:
    """Remove the cluster ``token`` kept by ``up``: stop its keeper, delete its namespaces."""
    held = owner(token)
    if token not in clusters() and not held:
        raise KeyError(f"no cluster {token!r} here (clusters: {sorted(clusters())})")
    if held.get("keeper"):
        _stop_pids([held["keeper"]])
    elif held.get("pid") and pid_alive(held["pid"]):
        raise RuntimeError(f"cluster {token!r} belongs to the running process {held['pid']} (not kept by `up`): "
                           "it removes its own cluster when it ends")
    fd = None
    deadline = time.monotonic() + 10
    while fd is None:
        fd = take_lock(token)
        if fd is None and time.monotonic() > deadline:
            raise RuntimeError(f"the lock of cluster {token!r} ({lock_path(token)}) is still held")
        time.sleep(0.05 if fd is None else 0)
    try:
        names = clusters().get(token, [])
        for name in names:
            delete_namespace(name)
        return names
    finally:
        release_lock(token, fd)


class Cluster:
    """Hosts (network namespaces) on one bridge. Use as a context manager, or call `close`.

    Args:
        hosts: host names, e.g. ``["trainer0", "trainer1", "rollout0"]``; each gets an address
            in order (``10.<net>.0.1``, ``.2``, ...).
        net: the second octet of the addresses (default: from the token, so two clusters differ).
        token: the cluster's name (default: a fresh ``c`` + 8 hex digits); its lock must be free.
    """

    def __init__(self, hosts: Sequence[str], net: int | None = None, token: str | None = None):
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"host names must be distinct and at least one, got {list(hosts)}")
        # A letter first: a token is never a PID (older runs named their namespaces rlpt<pid>-).
        self.token = token or f"c{secrets.token_hex(4)}"
        if self.token.isdigit() or "-" in self.token:
            raise ValueError(f"a cluster token has no '-' and is not a number, got {self.token!r}")
        self._lock = take_lock(self.token)
        if self._lock is None:
            raise RuntimeError(f"cluster {self.token!r} is held by another process ({owner(self.token)})")
        self.tag = f"{PREFIX}{self.token}"
        # Two clusters (two pytest-xdist workers) may draw the same net: harmless, since each cluster's
        # bridge lives in its own switch namespace and no address is given in the root namespace.
        self.net = 100 + zlib.crc32(self.token.encode()) % 100 if net is None else net
        self.switch = f"{self.tag}-sw"
        self.hosts = {h: f"10.{self.net}.0.{i + 1}" for i, h in enumerate(hosts)}
        self._made: list[str] = []
        self._record(keeper=None)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _record(self, keeper: int | None) -> None:
        """Who holds the cluster, in its lock file (read by `owner`, `down` and `list`)."""
        state = json.dumps({"pid": os.getpid(), "keeper": keeper, "hosts": self.hosts}).encode()
        os.ftruncate(self._lock, 0)
        os.pwrite(self._lock, state, 0)

    def keep(self) -> int:
        """Leave the cluster up after this process ends: a keeper (``sleep infinity``) holds the
        lock from now on, until `down` stops it by the PID written in the lock file."""
        keeper = subprocess.Popen(["sleep", "infinity"], pass_fds=[self._lock], start_new_session=True,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._record(keeper=keeper.pid)
        self._made.clear()  # no longer this object's to delete
        return keeper.pid

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
        """Stop every process on every host by PID, delete the namespaces, release the lock; safe twice."""
        for name in reversed(self._made):
            delete_namespace(name)
        self._made.clear()
        if self._lock is not None:
            release_lock(self.token, self._lock)
            self._lock = None

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in ("up", "down", "list") or (argv[0] == "down" and len(argv) != 2):
        print(__doc__)
        return 2
    if argv[0] == "list":
        for token, names in sorted(clusters().items()):
            fd = None if token.isdigit() else take_lock(token)
            if fd is not None:
                os.close(fd)  # only looked: a free lock file stays for the next sweep
            print(f"{token}\t{'free' if fd is not None else 'held'}\t{owner(token)}\t{' '.join(names)}")
        return 0
    if argv[0] == "down":
        try:
            for name in down(argv[1]):
                print("deleted", name)
        except (KeyError, RuntimeError) as err:
            print(f"cannot remove cluster {argv[1]}: {err.args[0]}", file=sys.stderr)
            return 1
        return 0
    why = Cluster.unavailable()
    if why:
        print(f"cannot build a cluster here: {why}", file=sys.stderr)
        return 1
    cluster = Cluster(argv[1:] or ["trainer0", "trainer1", "rollout0"])
    keeper = cluster.keep()
    print(f"token {cluster.token}")
    for host, address in cluster.hosts.items():
        print(f"{host}\t{cluster.namespace(host)}\t{address}")
    print(f"kept by process {keeper}; `python tests/netns_cluster.py down {cluster.token}` removes it")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
