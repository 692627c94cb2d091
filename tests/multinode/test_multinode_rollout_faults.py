"""Faults between trainer hosts and rollout hosts (network namespaces), each bounded in time with
a clear outcome: a rollout host that one trainer node cannot reach is refused at start on every
rank, naming the server and the rank; a rollout host whose link goes down mid-run is dropped
within the timeout of the call it was cut in (``request_timeout`` for a completion,
``control_timeout`` for a weight reload, the pool's connect timeout for a new connection), naming the server and the step, and the
run ends on the other server (which ends holding the trained weights); a rollout host that does
not see the trainer's snapshot directory is refused before the first sync, naming the server,
the directory and the fix."""
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from multinode_recipes import cause, env_for, recipe, start_servers

BLOCK = "trainer hosts with a rollout host"
FAILOVER = os.path.join(ROOT, "tests", "multinode", "failover_fit.py")
REQUEST_TIMEOUT = 20  # seconds a completion already sent to a cut host waits for its answer
CONTROL_TIMEOUT = 40  # seconds a weight reload already sent waits (the cut may land in a sync on a busy machine)
CONNECT_TIMEOUT = 10  # ServerPool's default: a new connection to a cut host fails after this long
BOUND = 240  # seconds from the nodes' start to their error: interpreters and imports on 2 busy cores


def _nodes(cluster, out, **env):
    return [cluster.popen(h, ["bash", "-c", recipe(BLOCK)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          env=env_for(NODE_RANK=str(i), MASTER_ADDR=cluster.hosts["trainer0"], OUT=str(out),
                                      SNAPSHOT_DIR=str(out.parent / "shared"), **env))
            for i, h in enumerate(["trainer0", "trainer1"])]


@pytest.mark.slow
def test_a_rollout_host_one_trainer_node_cannot_reach_is_refused_naming_it(cluster, tmp_path):
    hosts = cluster(["trainer0", "trainer1", "rollout0"])
    start_servers(hosts, ["rollout0"], tmp_path)
    hosts.blackhole("trainer1", hosts.hosts["rollout0"])  # trainer1 alone loses the route
    url = f"http://{hosts.hosts['rollout0']}:8000"
    started = time.monotonic()
    nodes = _nodes(hosts, tmp_path / "out", ROLLOUT_ADDR=hosts.hosts["rollout0"], RDZV_TIMEOUT="60")
    outputs = [n.communicate(timeout=BOUND + 60)[0].decode(errors="replace") for n in nodes]
    elapsed = time.monotonic() - started
    print(f"both trainer nodes refused the server after {elapsed:.0f} s")
    assert elapsed < BOUND
    both = "\n--- node 1:\n".join(cause(o) for o in outputs)
    assert [n.returncode != 0 for n in nodes] == [True, True], both
    for output in outputs:  # the same error on both nodes
        assert f"vLLM server {url} cannot be reached from trainer rank 1" in output, both
        assert "ranks [0] reach it" in output, both


def _wait_for(path, text: str, count: int, proc, timeout: float) -> float:
    """Seconds until ``path`` holds ``text`` ``count`` times (fails if ``proc`` ends first)."""
    started = time.monotonic()
    while open(path, errors="replace").read().count(text) < count:
        assert proc.poll() is None, f"the fit ended ({proc.returncode}) before {text!r} x{count} in {path}"
        assert time.monotonic() - started < timeout, f"no {text!r} x{count} in {path} within {timeout} s"
        time.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.slow
def test_a_rollout_host_cut_mid_run_is_dropped_in_bounded_time_and_the_run_goes_on(cluster, tmp_path):
    hosts = cluster(["trainer0", "rollout0", "rollout1"])
    start_servers(hosts, ["rollout0", "rollout1"], tmp_path)
    urls = [f"http://{hosts.hosts[h]}:8000" for h in ("rollout0", "rollout1")]
    out, log = tmp_path / "out", tmp_path / "trainer.log"
    node = hosts.popen("trainer0", [sys.executable, FAILOVER, "--strategy", "single", "--out", str(out), "--engine",
                                    "server", "--server-urls", ",".join(urls)],
                       cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                       env=env_for(REQUEST_TIMEOUT=str(REQUEST_TIMEOUT), CONTROL_TIMEOUT=str(CONTROL_TIMEOUT),
                                   FIT_STEPS="6"))
    # 16 rows a step over two servers: the 12th completion rollout1 answers falls in the second step
    _wait_for(tmp_path / "rollout1.log", '"POST /v1/completions', 12, node, BOUND)
    hosts.set_link("rollout1", False)
    dropped = _wait_for(log, f"vLLM server {urls[1]} dropped at global step", 1, node, BOUND)
    print(f"rollout1 dropped {dropped:.1f} s after its link went down:",
          *[line for line in open(log, errors="replace") if "vLLM server" in line], sep="\n")
    reason = open(log, errors="replace").read().split(f"vLLM server {urls[1]} dropped at global step", 1)[1][:200]
    # A request already sent waits its call's timeout for the reply (a completion request_timeout; every
    # other call, the weight reload and the version updates around it, control_timeout); a new
    # connection, connect_timeout.
    limit = (CONNECT_TIMEOUT if "ConnectTimeout" in reason else REQUEST_TIMEOUT if "/v1/completions" in reason
             else CONTROL_TIMEOUT)
    assert dropped < limit + 5, f"the pool waited {dropped:.0f} s for the cut host (its timeout: {limit} s): {reason}"
    assert node.wait(timeout=BOUND) == 0, open(log, errors="replace").read()[-3000:]
    print("syncs (bytes, seconds, live servers):", json.load(open(out / "syncs.json")))
    served = json.load(open(out / "served_rank0.json"))
    assert served["version"] == 6 and served["servers"] == 1 and served["parity"] <= 1e-3


@pytest.mark.slow
def test_a_rollout_host_without_the_snapshot_directory_is_refused_naming_it(cluster, tmp_path):
    hosts = cluster(["trainer0", "rollout0"])
    private = tmp_path / "trainer_only"  # the trainer's TMPDIR: its default snapshot directory goes there
    private.mkdir()
    start_servers(hosts, ["rollout0"], tmp_path, hide=str(private))
    url = f"http://{hosts.hosts['rollout0']}:8000"
    node = hosts.popen("trainer0", [sys.executable, FAILOVER, "--strategy", "single", "--out", str(tmp_path / "out"),
                                    "--engine", "server", "--server-urls", url],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=env_for(REQUEST_TIMEOUT="60", TMPDIR=str(private)))
    output = node.communicate(timeout=BOUND)[0].decode(errors="replace")
    assert node.returncode != 0
    assert f"vLLM server {url} cannot read the weight snapshot directory {private}/rlpt-weights-" in output, \
        cause(output)
    assert "pass SnapshotTransport(directory=...) on a filesystem every trainer and rollout host mounts" in output
