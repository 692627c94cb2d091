"""docs/distributed.md's recipe with a rollout host: the page's `vllm serve` block bound to its own
address in one network namespace, the page's wait for its /health, then two trainer hosts
(torchrun, gloo, examples/multihost.py) sampling from it over the bridge, the weights going
through ``--snapshot-dir``. The server ends holding the last step's weights, the snapshot
directory is left empty, and the metrics and final weights equal two processes on one host
sampling from the same server."""
import json
import sys

import pytest
import torch
from multinode_recipes import final_weights, metrics, recipe, run_nodes, run_single_host, start_servers

TIMEOUT = 600  # seconds for each fit (vLLM's CPU server starts in about a minute when the machine is idle)


@pytest.mark.slow
def test_trainer_hosts_sample_from_a_rollout_host_and_match_one_host(cluster, tmp_path):
    hosts = cluster(["trainer0", "trainer1", "rollout0"])
    start_servers(hosts, ["rollout0"], tmp_path)
    url = f"http://{hosts.hosts['rollout0']}:8000"
    shared = tmp_path / "shared"  # the page's $SNAPSHOT_DIR: one filesystem for every host here
    out = tmp_path / "nodes"
    run_nodes(hosts, ["trainer0", "trainer1"], recipe("trainer hosts with a rollout host"), TIMEOUT,
              MASTER_ADDR=hosts.hosts["trainer0"], ROLLOUT_ADDR=hosts.hosts["rollout0"], OUT=str(out),
              SNAPSHOT_DIR=str(shared))
    held = hosts.run("trainer0", [sys.executable, "-c", f"import urllib.request; print(urllib.request.urlopen("
                                  f"'{url}/weight_info', timeout=10).read().decode())"])
    assert json.loads(held.stdout)["weight_version"] == "3", held.stdout + held.stderr
    assert list(shared.iterdir()) == []  # every run's snapshot folder removed

    single = tmp_path / "one_host"
    run_single_host(single, "--server-urls", url, "--snapshot-dir", str(shared), timeout=TIMEOUT, cluster=hosts,
                    host="trainer0")
    two_nodes, one_host = metrics(out), metrics(single)
    assert len(two_nodes) == len(one_host) >= 3
    for step, (a, b) in enumerate(zip(two_nodes, one_host)):
        assert a.keys() == b.keys(), step
        assert a == pytest.approx(b, rel=1e-6, abs=1e-9), f"step {step}: the two-node run differs from one host"
    w_nodes, w_one = final_weights(out), final_weights(single)
    assert all(torch.allclose(w_nodes[k], w_one[k], rtol=1e-6, atol=1e-8) for k in w_nodes)
