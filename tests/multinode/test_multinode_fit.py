"""docs/distributed.md's trainer-host recipe, run as written on two hosts (network namespaces):
Lightning multi-node through torchrun, gloo between the hosts, examples/multihost.py. The run
checkpoints every 2 steps, and its metrics (step by step) and final weights equal two processes
on one host."""
import pytest
import torch

from multinode_recipes import final_weights, metrics, recipe, run_nodes, run_single_host

TIMEOUT = 420  # seconds for each fit (about 60 s when the machine is idle)


@pytest.mark.slow
def test_two_trainer_hosts_run_the_docs_recipe_and_match_one_host(cluster, tmp_path):
    hosts = cluster(["trainer0", "trainer1"])
    out = tmp_path / "nodes"
    run_nodes(hosts, ["trainer0", "trainer1"], recipe("test_multinode_fit.py runs this block"), TIMEOUT,
              MASTER_ADDR=hosts.hosts["trainer0"], OUT=str(out))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]

    single = tmp_path / "one_host"
    run_single_host(single, timeout=TIMEOUT)
    two_nodes, one_host = metrics(out), metrics(single)
    assert len(two_nodes) == len(one_host) >= 3
    for step, (a, b) in enumerate(zip(two_nodes, one_host)):
        assert a.keys() == b.keys(), step
        assert a == pytest.approx(b, rel=1e-6, abs=1e-9), f"step {step}: the two-node run differs from one host"
    w_nodes, w_one = final_weights(out), final_weights(single)
    assert w_nodes.keys() == w_one.keys() and len(w_nodes) > 0
    assert all(torch.allclose(w_nodes[k], w_one[k], rtol=1e-6, atol=1e-8) for k in w_nodes)
