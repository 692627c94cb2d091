"""docs/distributed.md's recipe with a rollout host: `vllm serve` bound to its own address in one
network namespace, two trainer hosts (torchrun, gloo) sampling from it over the bridge. Both
nodes finish with equal weights, the server ends holding the trained weights (version check and
log-prob parity), and the metrics equal two processes on one host with a launched server."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import ARITHMETIC

from multinode_recipes import env_for, metrics, recipe, run_nodes, run_single_host

TIMEOUT = 600  # seconds for each fit (vLLM's CPU server starts in about a minute when the machine is idle)
HEALTH = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)"


def start_server(cluster, host: str, log_path) -> subprocess.Popen:
    """The rollout host's block, run as written; returns once ``/health`` answers from a trainer host."""
    log = open(log_path, "wb")
    server = cluster.popen(host, ["bash", "-c", recipe("# a rollout host")], stdout=log,
                           stderr=subprocess.STDOUT, env=env_for(MODEL=os.path.join(ARITHMETIC, "warm_start"),
                                                                  HOST_ADDR=cluster.hosts[host]))
    url = f"http://{cluster.hosts[host]}:8000/health"
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the vLLM server on {host} exited ({server.returncode}):\n"
                                 + open(log_path, errors="replace").read()[-3000:])
        if cluster.run("trainer0", [sys.executable, "-c", HEALTH, url], timeout=30).returncode == 0:
            return server
        time.sleep(2)
    raise AssertionError(f"the vLLM server on {host} was not healthy within {TIMEOUT} s")


@pytest.mark.slow
def test_trainer_hosts_sample_from_a_rollout_host_and_match_one_host(cluster, tmp_path):
    hosts = cluster(["trainer0", "trainer1", "rollout0"])
    start_server(hosts, "rollout0", tmp_path / "vllm.log")
    out = tmp_path / "nodes"
    run_nodes(hosts, ["trainer0", "trainer1"], recipe("trainer hosts with a rollout host"), TIMEOUT,
              MASTER_ADDR=hosts.hosts["trainer0"], ROLLOUT_ADDR=hosts.hosts["rollout0"], OUT=str(out))
    w0, w1 = (torch.load(out / f"weights_rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0), "the two nodes hold different weights"
    served = [json.load(open(out / f"served_rank{r}.json")) for r in (0, 1)]
    assert [s["version"] for s in served] == [3, 3] and [s["servers"] for s in served] == [1, 1]
    assert served[0]["parity"] <= 1e-3  # the server computes the trained policy's log-probs

    hosts.close()  # frees the cores for the one-host run; the server is stopped by PID
    single = tmp_path / "one_host"
    run_single_host(single, "--engine", "server", timeout=TIMEOUT)
    two_nodes, one_host = metrics(out), metrics(single)
    assert len(two_nodes) == len(one_host) >= 3
    for step, (a, b) in enumerate(zip(two_nodes, one_host)):
        assert a.keys() == b.keys(), step
        assert a == pytest.approx(b, rel=1e-6, abs=1e-9), f"step {step}: the two-node run differs from one host"
