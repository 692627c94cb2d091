"""The test cluster itself: hosts reach each other by address and nothing else, a cut link
fails fast, everything it made is gone after `close` (processes by PID, namespaces by name),
and clusters have owners: a sweep takes only those whose lock is free, `down TOKEN` only its own."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from netns_cluster import PREFIX, Cluster, lock_path, namespaces, sweep

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = os.path.join(TESTS, "netns_cluster.py")
KILLED_BUILDER = ("import os, signal, netns_cluster as n; c = n.Cluster(['k']); print('token', c.token, flush=True); "
                  "os.kill(os.getpid(), signal.SIGKILL)")

PROBE = ("import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); "
         "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print(s.recv(12).decode())")


def _serve(cluster: Cluster, host: str, port: int) -> subprocess.Popen:
    server = cluster.popen(host, [sys.executable, "-m", "http.server", "--bind", cluster.hosts[host], str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if _reach(cluster, host, cluster.hosts[host], port).returncode == 0:
            return server
        time.sleep(0.2)
    raise AssertionError("the probe server did not start")


def _ip_link(namespace: str) -> str:
    return subprocess.run(["ip", "-n", namespace, "link"], capture_output=True, text=True, timeout=30).stdout


def _reach(cluster, host, address, port):
    return cluster.run(host, [sys.executable, "-c", PROBE, address, str(port)], timeout=20)


def test_hosts_reach_each_other_by_address_only(cluster):
    c = cluster(["trainer0", "trainer1", "rollout0"])
    server = _serve(c, "rollout0", 18000)
    for host in ("trainer0", "trainer1"):
        got = _reach(c, host, c.hosts["rollout0"], 18000)
        assert got.returncode == 0 and got.stdout.startswith("HTTP/1.0"), got.stderr
    # Loopback is each host's own: the server is not on trainer0's 127.0.0.1.
    assert _reach(c, "trainer0", "127.0.0.1", 18000).returncode != 0
    # A cut link fails within the client's own timeout, and comes back when restored.
    c.set_link("rollout0", up=False)
    started = time.monotonic()
    assert _reach(c, "trainer0", c.hosts["rollout0"], 18000).returncode != 0
    assert time.monotonic() - started < 15
    c.set_link("rollout0", up=True)
    assert _reach(c, "trainer0", c.hosts["rollout0"], 18000).returncode == 0
    assert server.pid in c.pids("rollout0")  # `ip netns exec` execs the server: its PID is the host's
    c.close()
    assert server.wait(timeout=10) is not None  # stopped by PID
    assert not [n for n in namespaces() if n.startswith(c.tag)]


def test_a_failed_test_still_leaves_nothing(cluster):
    c = cluster(["a", "b"])
    _serve(c, "b", 18001)
    with pytest.raises(KeyError, match="no host 'z'"):
        c.popen("z", ["true"])
    c.close()
    assert not [n for n in namespaces() if n.startswith(c.tag)]


def _sweep_elsewhere() -> list[str]:
    """`sweep` as a concurrent test run calls it: from another process."""
    done = subprocess.run([sys.executable, "-c", "import netns_cluster as n; print(' '.join(n.sweep()))"],
                          cwd=TESTS, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_clusters_have_owners_and_a_sweep_takes_only_the_unowned(cluster):
    mine = cluster(["a", "b"])
    up = subprocess.run([sys.executable, NETNS, "up", "x", "y"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    [token] = re.findall(r"^token (\S+)$", up.stdout, flags=re.M)  # `up` prints the token it holds
    kept = [f"{PREFIX}{token}-{h}" for h in ("sw", "x", "y")]
    try:
        # A killed builder (SIGKILL: no close) leaves namespaces whose lock nobody holds.
        killed = subprocess.run([sys.executable, "-c", KILLED_BUILDER], cwd=TESTS, capture_output=True, text=True,
                                timeout=120)
        [orphan] = re.findall(r"^token (\S+)$", killed.stdout, flags=re.M)
        assert killed.returncode == -signal.SIGKILL and f"{PREFIX}{orphan}-k" in namespaces()
        swept = _sweep_elsewhere()
        assert sorted(swept) == sorted([f"{PREFIX}{orphan}-sw", f"{PREFIX}{orphan}-k"]), swept
        here = namespaces()
        assert set(kept) <= set(here), "a sweep deleted the cluster `up` keeps"
        assert {mine.switch, mine.namespace("a"), mine.namespace("b")} <= set(here), "a sweep deleted a live run's"
        # `down TOKEN` removes that cluster only.
        down = subprocess.run([sys.executable, NETNS, "down", token], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        here = namespaces()
        assert not set(kept) & set(here) and {mine.namespace("a"), mine.namespace("b")} <= set(here)
        assert "eth0" in _ip_link(mine.namespace("a")) and not os.path.exists(lock_path(token))
    finally:
        if os.path.exists(lock_path(token)):  # still held by its keeper: stop it too
            subprocess.run([sys.executable, NETNS, "down", token], capture_output=True, timeout=120)
    refused = subprocess.run([sys.executable, NETNS, "down", mine.token], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "belongs to the running process" in refused.stderr  # not `up`'s: left alone


def test_an_older_runs_pid_named_namespaces_are_swept_when_that_pid_is_gone():
    if Cluster.unavailable():
        pytest.skip(Cluster.unavailable())
    dead = subprocess.Popen(["true"])
    dead.wait()  # a PID that no longer runs stands for a killed test run of the code before tokens
    name = f"{PREFIX}{dead.pid}-left"
    subprocess.run(["ip", "netns", "add", name], check=True)
    assert name in sweep() and name not in namespaces()


def test_bad_host_names_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        Cluster(["a", "a"])
