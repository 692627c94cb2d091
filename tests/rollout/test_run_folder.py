"""A run's snapshot folder (`SnapshotTransport.under`, `rollout.vllm.run_folder`) is gone after
every way the run can end: a normal exit, an exception, SIGINT, SIGTERM (also sent to torchrun,
as a scheduler does), SIGKILL; one left when the janitor was killed too is removed, and named, at
the next start. A directory this host cannot write is refused, naming it and the host."""
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from lightning_rlpt.processes import pid_alive
from lightning_rlpt.rollout.vllm.run_folder import OWNER
from lightning_rlpt.rollout.vllm.transport import SnapshotTransport

# The run's own SIGINT handling, whatever this process's: a shell running a command in the
# background (`make test &`, CI runners) starts it with SIGINT ignored, and Python then keeps it so.
RUN = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from lightning_rlpt.rollout.vllm.run_folder import _OWNED
from lightning_rlpt.rollout.vllm.transport import SnapshotTransport
transport = SnapshotTransport.under(sys.argv[1])
open(os.path.join(transport.directory, "model.safetensors"), "wb").write(bytes(1 << 20))
print(transport.directory, _OWNED[transport.directory][1].pid, flush=True)
sys.stdin.readline()  # the test has seen the folder
if sys.argv[2] == "exit":
    sys.exit(0)  # no close(): the atexit hook
if sys.argv[2] == "exception":
    raise RuntimeError("a failed step")
signal.pause()
"""
ENDS = {"exit": None, "exception": None, "SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM,
        "SIGKILL": signal.SIGKILL, "torchrun SIGTERM": signal.SIGTERM}


def _start(parent, how: str) -> tuple[subprocess.Popen, str, int]:
    argv = [sys.executable, "-c", RUN, str(parent), how]
    if how.startswith("torchrun"):  # torchrun forwards the signal to its worker, SIGKILL after 30 s
        script = parent / "run.py"
        script.write_text(RUN)
        argv = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc-per-node", "1",
                "--master-port", "0", str(script), str(parent), how]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, start_new_session=True)
    line = run.stdout.readline().split()
    assert len(line) == 2, run.communicate(timeout=60)[1][-2000:]
    assert os.path.exists(os.path.join(line[0], "model.safetensors"))
    return run, line[0], int(line[1])


def _gone_within(path: str, seconds: float) -> float:
    started = time.monotonic()
    while os.path.exists(path) if not path.startswith("/proc/") else pid_alive(int(path.split("/")[2])):
        assert time.monotonic() - started < seconds, f"{path} still there after {seconds} s: {os.listdir(path)}"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.parametrize("how", list(ENDS))
def test_the_snapshot_folder_is_gone_however_the_run_ends(tmp_path, how):
    run, folder, janitor = _start(tmp_path, how)
    if ENDS[how] is not None:
        os.kill(run.pid, ENDS[how])
    run.communicate("go\n", timeout=60)
    assert run.returncode != 0 or how == "exit"
    _gone_within(folder, 5)
    _gone_within(f"/proc/{janitor}", 15)  # the janitor went with it
    assert not [n for n in os.listdir(tmp_path) if n.startswith("rlpt-weights-")]


def test_a_leftover_of_a_run_killed_with_its_janitor_is_removed_and_named_at_the_next_start(tmp_path, caplog):
    other, live_folder, _ = _start(tmp_path, "SIGTERM")  # a live run beside it: its owner lock is held
    run, folder, janitor = _start(tmp_path, "SIGKILL")
    try:
        os.killpg(janitor, signal.SIGKILL)  # the janitor first (a job's whole cgroup killed): nothing cleans up
        _gone_within(f"/proc/{janitor}", 5)
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.communicate(timeout=60)
    assert os.path.exists(os.path.join(folder, OWNER))  # left behind
    try:
        caplog.set_level(logging.WARNING, logger="lightning_rlpt.rollout.vllm.run_folder")
        transport = SnapshotTransport.under(str(tmp_path))
        assert not os.path.exists(folder) and os.path.exists(live_folder)
        assert f"removed {folder}, left by a run that ended without removing it (host " in caplog.text
        assert f"pid {run.pid}" in caplog.text
        transport.close()
        assert not os.path.exists(transport.directory)
    finally:
        os.kill(other.pid, signal.SIGTERM)
        other.communicate(timeout=60)


def test_a_snapshot_directory_this_host_cannot_write_is_refused_naming_it(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    os.chmod(read_only, 0o500)
    if os.access(read_only, os.W_OK):  # root ignores the mode: a path under a file fails for everyone
        read_only = tmp_path / "a_file" / "weights"
        (tmp_path / "a_file").write_text("")
    transport = SnapshotTransport.under(str(read_only))  # every rank's problem is raised at setup (test_vllm_reach)
    assert transport.problem.startswith(f"cannot write the weight snapshot directory {read_only} on host ")
    with pytest.raises(ValueError, match="choose a directory this host can write"):
        transport.send(None, [], tie_word_embeddings=False)
    transport.close()
    assert read_only.parent.exists()  # close never removes the parent it could not write
