"""docs/distributed.md's trainer-host recipe, run as written on two hosts (network namespaces):
Lightning multi-node through torchrun, gloo between the hosts. Both nodes finish, hold the same
weights, and log the same metrics step by step as two processes on one host."""
import csv
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TESTS, WALL_CLOCK

DOC = os.path.join(ROOT, "docs", "distributed.md")
SCRIPT = os.path.join(TESTS, "scripts", "distributed_fit.py")
TIMEOUT = 420  # seconds for the whole two-node fit (about 60 s when the machine is idle)


def recipe() -> str:
    """The bash block of docs/distributed.md that names this test."""
    blocks = re.findall(r"```bash\n(.*?)```", open(DOC).read(), flags=re.S)
    [block] = [b for b in blocks if "test_multinode_fit.py runs this block" in b]
    return block


def metrics(out) -> list[dict[str, float]]:
    rows = []
    for path in sorted(out.glob("**/metrics.csv")):
        with open(path) as f:
            rows += [{k: float(v) for k, v in r.items() if v != "" and not k.startswith(WALL_CLOCK)}
                     for r in csv.DictReader(f)]
    assert rows, f"no metrics under {out}"
    return rows


def _cause(log: str) -> str:
    """The first traceback of a node's output (torchrun's summary after it says little)."""
    start = log.find("Traceback")
    return log[start:start + 4000] if start >= 0 else log[-3000:]


def env_for(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # torchrun of this venv
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@pytest.mark.slow
def test_two_trainer_hosts_run_the_docs_recipe_and_match_one_host(cluster, tmp_path):
    hosts = cluster(["trainer0", "trainer1"])
    out = tmp_path / "nodes"
    nodes = [hosts.popen(h, ["bash", "-c", recipe()], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=env_for(NODE_RANK=str(i), MASTER_ADDR=hosts.hosts["trainer0"], OUT=str(out)))
             for i, h in enumerate(hosts.hosts)]
    logs = []
    for node in nodes:
        try:
            logs.append(node.communicate(timeout=TIMEOUT)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            hosts.close()
            pytest.fail(f"the two-node fit did not end within {TIMEOUT} s")
    assert [n.returncode for n in nodes] == [0, 0], "\n---\n".join(_cause(log) for log in logs)
    w0, w1 = (torch.load(out / f"weights_rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0), "the two nodes hold different weights"

    single = tmp_path / "one_host"
    done = subprocess.run([sys.executable, SCRIPT, "--strategy", "ddp", "--out", str(single)], env=env_for(),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    two_nodes, one_host = metrics(out), metrics(single)
    assert len(two_nodes) == len(one_host) >= 3
    for step, (a, b) in enumerate(zip(two_nodes, one_host)):
        assert a.keys() == b.keys(), step
        assert a == pytest.approx(b, rel=1e-6, abs=1e-9), f"step {step}: the two-node run differs from one host"
    one_w = torch.load(single / "weights.pt")
    assert all(torch.allclose(w0[k], one_w[k], rtol=1e-6, atol=1e-8) for k in w0)
