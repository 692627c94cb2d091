"""`pid_alive`: a running process is alive; an ended one is not, reaped (ESRCH) or not yet
(a zombie); another user's (EPERM) is alive; zero and negative numbers (process groups) are not."""
import os
import subprocess
import sys
import time

import pytest

from lightning_rlpt.processes import pid_alive


def test_this_process_is_alive():
    assert pid_alive(os.getpid())


def test_a_running_child_is_alive_until_it_ends_and_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="a zombie is told apart through /proc")
def test_an_ended_child_not_yet_reaped_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while pid_alive(child.pid):  # a zombie once it exits: os.kill(pid, 0) still reaches it
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.05)
        os.kill(child.pid, 0)  # still there, unreaped: no ProcessLookupError
    finally:
        child.wait()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may signal every process")
def test_another_users_process_is_alive():
    assert pid_alive(1)  # init: another user's, signal 0 refused with EPERM


@pytest.mark.parametrize("pid", [0, -1])
def test_a_process_group_is_not_a_process(pid):
    assert not pid_alive(pid)
