"""Faults across trainer hosts (network namespaces), each bounded in time with a clear outcome:
an unreachable rendezvous address fails naming it; a trainer node killed mid-step ends the other
node, which names the dead peer, and leaves no process behind."""
import glob
import os
import re
import signal
import subprocess
import time

import pytest
from conftest import ROOT

from multinode_recipes import env_for, recipe

BLOCK = "test_multinode_fit.py runs this block"
RDZV_TIMEOUT = 20  # the recipe's --rdzv-conf timeout, set through $RDZV_TIMEOUT
SLACK = 90  # seconds for interpreters to start on 2 busy cores


def _node(cluster, host, rank, master, out, **env):
    return cluster.popen(host, ["bash", "-c", recipe(BLOCK)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT,
                         env=env_for(NODE_RANK=str(rank), MASTER_ADDR=master, OUT=str(out), **env))


@pytest.mark.slow
@pytest.mark.parametrize("master", ["no host", "nothing listening"])
def test_an_unreachable_rendezvous_fails_naming_the_address_within_the_timeout(cluster, master, tmp_path):
    hosts = cluster(["trainer0", "trainer1"])
    address = f"10.{hosts.net}.0.99" if master == "no host" else hosts.hosts["trainer0"]
    started = time.monotonic()
    node = _node(hosts, "trainer1", 1, address, tmp_path, RDZV_TIMEOUT=str(RDZV_TIMEOUT))
    output = node.communicate(timeout=RDZV_TIMEOUT + SLACK)[0].decode(errors="replace")
    assert node.returncode != 0
    assert time.monotonic() - started < RDZV_TIMEOUT + SLACK
    assert "DistNetworkError" in output and address in output, output[-2000:]


@pytest.mark.slow
def test_a_trainer_node_killed_mid_step_ends_the_other_naming_it(cluster, tmp_path):
    hosts = cluster(["trainer0", "trainer1"])
    nodes = [_node(hosts, h, i, hosts.hosts["trainer0"], tmp_path, FIT_STEPS="50") for i, h in enumerate(hosts.hosts)]
    deadline = time.monotonic() + 400
    while not glob.glob(str(tmp_path / "**" / "metrics.csv"), recursive=True):  # training has started
        assert time.monotonic() < deadline and nodes[0].poll() is None, "the two-node fit did not start"
        time.sleep(1)
    for pid in hosts.pids("trainer1"):  # the whole node: torchrun and its worker
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    output = nodes[0].communicate(timeout=120)[0].decode(errors="replace")
    assert time.monotonic() - killed < 60, "the surviving node took more than 60 s to end"
    assert nodes[0].returncode != 0
    # gloo says "closed" or "reset" depending on where the worker was in its read
    assert re.search(r"Connection (closed|reset) by peer", output) and hosts.hosts["trainer1"] in output, output[-2000:]
    assert hosts.pids("trainer0") == []  # torchrun and its worker are gone
