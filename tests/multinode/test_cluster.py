"""The test cluster itself: hosts reach each other by address and nothing else, a cut link
fails fast, and everything it made is gone after `close` (processes by PID, namespaces by name)."""
import os
import subprocess
import sys
import time

import pytest

from netns_cluster import PREFIX, Cluster, namespaces, sweep

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


def test_sweep_removes_what_a_killed_run_left():
    if Cluster.unavailable():
        pytest.skip(Cluster.unavailable())
    dead = subprocess.Popen(["true"])
    dead.wait()  # a PID that no longer runs stands for a killed test run
    name = f"{PREFIX}{dead.pid}-left"
    subprocess.run(["ip", "netns", "add", name], check=True)
    assert name in sweep() and name not in namespaces()
    assert f"{PREFIX}{os.getpid()}-x" not in sweep()  # a live run's namespaces are left alone


def test_bad_host_names_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        Cluster(["a", "a"])
