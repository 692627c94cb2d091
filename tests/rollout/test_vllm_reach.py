"""Reaching vLLM servers from a trainer rank, without a server (issue 27 item 3): every URL is
probed at start and an unreachable one is refused naming it and the rank (`rollout.vllm.reach`);
a connection that never opens (a host whose link is down sends no refusal) fails after the pool's
``connect_timeout``, not the request's. The multi-host cases are tests/multinode."""
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from lightning_rlpt.rollout.servers.pool import ServerFailure, ServerPool
from lightning_rlpt.rollout.vllm.reach import UnreachableServer, check_reachable


class Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def healthy_url():
    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_is_refused_naming_it_and_the_rank(healthy_url):
    check_reachable([healthy_url], timeout=5)  # a healthy one passes
    dead = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(UnreachableServer, match=rf"vLLM server {dead} cannot be reached from trainer rank 0 "
                                                rf"\(host [^)]+\): ConnectionError") as err:
        check_reachable([healthy_url, dead], timeout=5)
    assert healthy_url not in str(err.value) and "--host" in str(err.value)


def test_a_connection_that_never_opens_fails_after_the_connect_timeout():
    # A listener that never accepts, its queue full: the kernel drops further SYNs, as a cut link does.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(listener.getsockname())
        fillers.append(s)
    time.sleep(0.2)
    pool = ServerPool([f"http://127.0.0.1:{listener.getsockname()[1]}"], model="m", request_timeout=60,
                      control_timeout=60, connect_timeout=1)
    started = time.monotonic()
    with pytest.raises(ServerFailure, match="ConnectTimeout"):
        pool.post(pool.urls[0], "/update_weight_version")
    assert time.monotonic() - started < 10
    for s in fillers + [listener]:
        s.close()


TWO_RANKS = """
import os, sys, torch.distributed as dist, torch.multiprocessing as mp
from lightning_rlpt.rollout.vllm.reach import check_reachable
from lightning_rlpt.rollout.vllm.transport import SnapshotTransport

def rank(r, port, parents):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=2)
    transport = SnapshotTransport.under(parents[r])
    try:
        check_reachable([], local_problem=transport.problem)
        print(f"rank {r} passed", flush=True)
    except ValueError as err:
        print(f"rank {r} refused: {err}", flush=True)
    transport.close()

mp.start_processes(rank, args=(int(sys.argv[1]), sys.argv[2:]), nprocs=2, start_method="fork")
"""


def test_a_snapshot_directory_one_rank_cannot_write_is_refused_on_every_rank(tmp_path):
    """Rank 1's host cannot write the directory: both ranks refuse at start, naming rank 1's host
    and the directory (rank 1 alone failing would leave rank 0 waiting in a collective)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    unwritable = tmp_path / "a_file" / "weights"  # under a file: no one can write it, root included
    (tmp_path / "a_file").write_text("")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", TWO_RANKS, str(closed_port()), str(tmp_path / "ok"), str(unwritable)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for r in (0, 1):
        assert f"rank {r} refused: rank 1 (host {socket.gethostname()}): cannot write the weight snapshot directory " \
               f"{unwritable} on host" in done.stdout, done.stdout + done.stderr[-2000:]
    assert [p.name for p in (tmp_path / "ok").iterdir()] == []  # rank 0's folder removed by close
