"""docs/distributed.md's recipe with a rollout host: `vllm serve` bound to its own address in one
network namespace, two trainer hosts (torchrun, gloo) sampling from it over the bridge. Both
nodes finish with equal weights, the server ends holding the trained weights (version check and
log-prob parity), and the metrics equal two processes on one host with a launched server."""
import json

import pytest
import torch
from multinode_recipes import metrics, recipe, run_nodes, run_single_host, start_servers

TIMEOUT = 600  # seconds for each fit (vLLM's CPU server starts in about a minute when the machine is idle)


@pytest.mark.slow
def test_trainer_hosts_sample_from_a_rollout_host_and_match_one_host(cluster, tmp_path):
    hosts = cluster(["trainer0", "trainer1", "rollout0"])
    start_servers(hosts, ["rollout0"], tmp_path)
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
