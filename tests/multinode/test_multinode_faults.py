"""Faults across trainer hosts (network namespaces), each bounded in time with a clear outcome:
an unreachable rendezvous address fails naming it; a trainer node killed mid-step ends the other
node, which names the dead peer, and leaves no process behind; a frozen node (SIGSTOP) or a cut
link between the nodes ends the run within the collective timeout (`CollectiveWatchdog`, the
page's ``$COLLECTIVE_TIMEOUT``) with an error naming the silent host, the step and the last
checkpoint, after warnings that name it while waiting."""
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
COLLECTIVE_TIMEOUT = 20  # the page's $COLLECTIVE_TIMEOUT here (a step takes about 1 s)


def _node(cluster, host, rank, master, out, **env):
    """The page's block on ``host``; its output goes to ``out/node<rank>.log`` (`_output`)."""
    os.makedirs(out, exist_ok=True)
    return cluster.popen(host, ["bash", "-c", recipe(BLOCK)], cwd=ROOT, stdout=open(out / f"node{rank}.log", "wb"),
                         stderr=subprocess.STDOUT,
                         env=env_for(NODE_RANK=str(rank), MASTER_ADDR=master, OUT=str(out), **env))


def _output(node, out, rank: int, timeout: float) -> str:
    node.wait(timeout=timeout)
    return open(out / f"node{rank}.log", errors="replace").read()


def _two_nodes_training(hosts, out, **env) -> list[subprocess.Popen]:
    """Both nodes on the page's block, returned once the first checkpoint (step 2) is written."""
    nodes = [_node(hosts, h, i, hosts.hosts["trainer0"], out, **env) for i, h in enumerate(hosts.hosts)]
    deadline = time.monotonic() + 400
    while not glob.glob(str(out / "checkpoints" / "epoch=0-step=*.ckpt")):
        assert time.monotonic() < deadline and nodes[0].poll() is None, \
            "the two-node fit did not start: " + open(out / "node0.log", errors="replace").read()[-3000:]
        time.sleep(0.5)
    return nodes


@pytest.mark.slow
@pytest.mark.parametrize("master", ["no host", "nothing listening"])
def test_an_unreachable_rendezvous_fails_naming_the_address_within_the_timeout(cluster, master, tmp_path):
    hosts = cluster(["trainer0", "trainer1"])
    address = f"10.{hosts.net}.0.99" if master == "no host" else hosts.hosts["trainer0"]
    started = time.monotonic()
    node = _node(hosts, "trainer1", 1, address, tmp_path, RDZV_TIMEOUT=str(RDZV_TIMEOUT))
    output = _output(node, tmp_path, 1, RDZV_TIMEOUT + SLACK)
    assert node.returncode != 0
    assert time.monotonic() - started < RDZV_TIMEOUT + SLACK
    assert "DistNetworkError" in output and address in output, output[-2000:]


@pytest.mark.slow
def test_a_trainer_node_killed_mid_step_ends_the_other_naming_it(cluster, tmp_path):
    hosts = cluster(["trainer0", "trainer1"])
    nodes = _two_nodes_training(hosts, tmp_path, FIT_STEPS="200")
    for pid in hosts.pids("trainer1"):  # the whole node: torchrun and its worker
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    output = _output(nodes[0], tmp_path, 0, 120)
    assert time.monotonic() - killed < 60, "the surviving node took more than 60 s to end"
    assert nodes[0].returncode != 0
    # gloo says "closed" or "reset" depending on where the worker was in its read
    assert re.search(r"Connection (closed|reset) by peer", output) and hosts.hosts["trainer1"] in output, output[-2000:]
    assert hosts.pids("trainer0") == []  # torchrun and its worker are gone


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["frozen node", "cut link"])
def test_a_silent_trainer_node_ends_the_run_within_the_timeout_naming_it(cluster, fault, tmp_path):
    hosts = cluster(["trainer0", "trainer1"])
    nodes = _two_nodes_training(hosts, tmp_path, FIT_STEPS="400", COLLECTIVE_TIMEOUT=str(COLLECTIVE_TIMEOUT))
    if fault == "frozen node":
        for pid in hosts.pids("trainer1"):  # torchrun and its worker: every thread stops, heartbeats too
            os.kill(pid, signal.SIGSTOP)
    else:
        hosts.set_link("trainer1", up=False)  # no FIN, no RST: the peers just stop hearing each other
    silenced = time.monotonic()
    ending = nodes if fault == "cut link" else nodes[:1]  # a frozen node cannot end; cluster.close kills it
    outputs = [_output(n, tmp_path, rank, COLLECTIVE_TIMEOUT + SLACK) for rank, n in enumerate(ending)]
    took = time.monotonic() - silenced
    print(f"{fault}: the run ended {took:.0f} s after (collective timeout {COLLECTIVE_TIMEOUT} s)")
    assert took < COLLECTIVE_TIMEOUT + 40
    assert all(n.returncode != 0 for n in ending)
    checkpoint = f"Last checkpoint: {tmp_path / 'checkpoints'}/"
    survivor = outputs[0]
    # node 0 names rank 1 and its host: in the warnings while waiting, and in the error at the end
    named = re.findall(rf"CollectiveWatchdog: rank 0 \(\S+ {re.escape(hosts.hosts['trainer0'])}\) at global step "
                       rf"(\d+), waiting \d+ s(?: since the step ended)?: rank 1 \(\S+ {re.escape(hosts.hosts['trainer1'])}\) silent for \d+ s "
                       rf"\(last heard at step \d+\)\. Collective timeout {COLLECTIVE_TIMEOUT} s\. {re.escape(checkpoint)}",
                       survivor)
    assert len(named) >= 2, survivor[-4000:]
    # gloo words its timeout two ways, by which side of the pair gives up first: "Timed out waiting
    # ..." or "Application timeout caused pair closure" (seen in a CI run, frozen node)
    ended = re.findall(r"The run ended with \w+: .*", survivor)
    assert ended and re.search(r"Timed out|timeout", ended[0]), survivor[-4000:]
    if fault == "cut link":  # node 1 cannot reach node 0 (its store) either, and says so
        assert f"the rendezvous store at {hosts.hosts['trainer0']}:29500 (node 0) has not answered" in outputs[1], \
            outputs[1][-4000:]
