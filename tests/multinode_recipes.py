"""What the multi-host tests share: docs/distributed.md's blocks as written (each host runs the
page's "every host, first" block, then the block at hand), each host's environment (the page's
variables), and the metrics and weights a run wrote."""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time

from conftest import ARITHMETIC, ROOT, NOT_COMPARED

DOC = os.path.join(ROOT, "docs", "distributed.md")
SCRIPT = os.path.join(ROOT, "examples", "multihost.py")
VENV = os.path.dirname(os.path.dirname(sys.executable))  # the page's $VENV: this interpreter's virtualenv


def recipe(marker: str) -> str:
    """The one bash block of docs/distributed.md whose text contains ``marker``, after the page's
    block for every host (``cd $REPO``, the virtualenv on ``PATH``, the shared interface)."""
    blocks = re.findall(r"```bash\n(.*?)```", open(DOC).read(), flags=re.S)
    [first] = [b for b in blocks if "# every host, first" in b]
    [block] = [b for b in blocks if marker in b]
    return f"set -e\n{first}\n{block}"


def env_for(**extra: str) -> dict[str, str]:
    """This environment without a launcher's rank variables and without this venv on ``PATH``
    (the page's first block puts it there), with the page's ``$REPO``, ``$VENV`` and ``$IFNAME`` (each
    namespaced host's interface is ``eth0``), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p != os.path.join(VENV, "bin"))
    return {**env, "PYTHONUNBUFFERED": "1", "REPO": ROOT, "VENV": VENV, "IFNAME": "eth0", **extra}


def final_weights(out) -> dict:
    """The policy's weights in ``out/final.ckpt`` (examples/multihost.py writes it at the end)."""
    import torch

    state = torch.load(os.path.join(out, "final.ckpt"), map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("policy.")}


def metrics(out) -> list[dict[str, float]]:
    """Every row of every metrics.csv under ``out``, without wall-clock columns."""
    rows = []
    for path in sorted(out.glob("**/metrics.csv")):
        with open(path) as f:
            rows += [{k: float(v) for k, v in r.items() if v != "" and not k.startswith(NOT_COMPARED)}
                     for r in csv.DictReader(f)]
    assert rows, f"no metrics under {out}"
    return rows


def cause(log: str) -> str:
    """The first traceback of a process's output (torchrun's summary after it says little)."""
    start = log.find("Traceback")
    return log[start:start + 4000] if start >= 0 else log[-3000:]


def run_nodes(cluster, hosts: list[str], block: str, timeout: float, **env: str) -> None:
    """``block`` on each host at once (``NODE_RANK`` = its position); both must end, with 0, in time."""
    nodes = [cluster.popen(h, ["bash", "-c", block], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env=env_for(NODE_RANK=str(i), **env)) for i, h in enumerate(hosts)]
    logs = []
    deadline = time.monotonic() + timeout
    for node in nodes:
        try:
            logs.append(node.communicate(timeout=max(1.0, deadline - time.monotonic()))[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            cluster.close()
            raise AssertionError(f"the nodes did not end within {timeout} s") from None
    assert [n.returncode for n in nodes] == [0] * len(nodes), "\n---\n".join(cause(log) for log in logs)


def run_single_host(out, *args: str, timeout: float, cluster=None, host: str | None = None) -> None:
    """The same script as two processes on one host (Lightning's own launcher): this machine, or
    ``host`` of ``cluster``."""
    argv = [sys.executable, SCRIPT, "--num-nodes", "1", "--devices", "2", "--out", str(out), *args]
    done = cluster.run(host, argv, timeout=timeout, env=env_for()) if cluster else \
        subprocess.run(argv, env=env_for(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, cause(done.stderr)


def start_servers(cluster, hosts: list[str], log_dir, probe_from: str = "trainer0", timeout: float = 600,
                  hide: str | None = None) -> list[subprocess.Popen]:
    """The rollout host's block, run as written on each of ``hosts`` at once (logs
    ``<log_dir>/<host>.log``); returns once each ``/health`` answers from ``probe_from``. ``hide``:
    a directory the servers do not see (an empty tmpfs over it in a mount namespace of their own),
    as a host without the trainer's filesystem."""
    argv = ["bash", "-c", recipe("# a rollout host")]
    if hide:  # "$0" is the block: no quoting of it inside the sh command
        argv = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs none {hide} && exec bash -c "$0"', argv[-1]]
    servers = []
    for host in hosts:
        log = open(os.path.join(log_dir, f"{host}.log"), "wb")
        servers.append(cluster.popen(host, argv, stdout=log,
                                     stderr=subprocess.STDOUT, env=env_for(MODEL=os.path.join(ARITHMETIC, "warm_start"),
                                                                            HOST_ADDR=cluster.hosts[host])))
    deadline = time.monotonic() + timeout
    for host, server in zip(hosts, servers):  # the page's wait, from a trainer host
        wait = cluster.popen(probe_from, ["bash", "-c", recipe("wait for the rollout host")], cwd=ROOT,
                             stdout=subprocess.DEVNULL, env=env_for(ROLLOUT_ADDR=cluster.hosts[host]))
        while wait.poll() is None:
            if server.poll() is not None or time.monotonic() > deadline:
                os.killpg(wait.pid, 9)
                wait.wait()
                why = f"exited ({server.returncode})" if server.poll() is not None else f"not healthy in {timeout} s"
                raise AssertionError(f"the vLLM server on {host} {why}:\n"
                                     + open(os.path.join(log_dir, f"{host}.log"), errors="replace").read()[-3000:])
            time.sleep(1)
        assert wait.returncode == 0
    return servers
