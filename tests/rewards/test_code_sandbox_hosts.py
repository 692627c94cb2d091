"""The sandbox on the hosts it meets (issue 35): a virtualenv reached through a symlink, a sandbox
that cannot start (an infrastructure failure, never a sample's score), a trainer that is PID 1
(``unshare --pid --fork``), and a neighbour that forks setsid() spinners (a cpu cgroup each)."""
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards import RewardFunctions
from lightning_rlpt.rewards.code import SandboxUnavailable
from lightning_rlpt.rewards.code.sandbox import Limits, run_program
from lightning_rlpt.rewards.code.sandbox_cgroup import controller_root

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")
SCORE = """
from lightning_rlpt.rewards.code.sandbox import run_program, run_tests
print(run_tests("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"]).passed,
      run_program("print(input()[::-1])", "abc").stdout.strip())
"""


def test_a_virtualenv_reached_through_a_symlink_and_dots_runs(tmp_path):
    """The trainer started as ``../venv-link/bin/python``: before, bwrap could not exec that path
    inside ("execvp ...: No such file or directory") and every completion was killed."""
    (tmp_path / "venv-link").symlink_to(os.path.realpath(sys.prefix))
    (tmp_path / "work").mkdir()
    out = subprocess.run(["../venv-link/bin/python", "-c", SCORE], cwd=tmp_path / "work", capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split("\n")[-2:] == ["(True, False) cba", ""], out.stderr[-2000:]


def broken_interpreter(tmp_path):
    """An interpreter that cannot start inside the sandbox (as a missing mount would make it)."""
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexec /nonexistent/python3 \"$@\"\n")
    python.chmod(0o755)
    return str(python)


def test_a_sandbox_that_cannot_start_is_named_not_scored(tmp_path, monkeypatch):
    python = broken_interpreter(tmp_path)
    with pytest.raises(SandboxUnavailable, match=r"cannot start.*trial run of .*env/bin/python.*Fix: "):
        run_program("print(1)", python=python)
    monkeypatch.setattr(sys, "executable", python)  # the trainer's own interpreter, as the reward uses it
    for on_error in ("raise", "zero"):  # before: "zero" scored every completion 0
        with pytest.raises(SandboxUnavailable, match="cannot start"):
            RewardFunctions([CodeExecutionReward(timeout=5)], on_error=on_error)(
                ["q"] * 2, ["def f(): return 1"] * 2, {"tests": [["assert f() == 1"]] * 2})


def test_bwrap_missing_is_raised_under_reward_on_error_zero(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        RewardFunctions([CodeExecutionReward(timeout=5)], on_error="zero")(
            ["q"], ["def f(): return 1"], {"tests": [["assert f() == 1"]]})


REAPED = """
import os
from lightning_rlpt.rewards.code.sandbox import Limits, run_program, run_tests
assert os.getpid() == 1
run_tests("def f():\\n    return 1", ["assert f() == 1"])
run_tests("while True:\\n    pass", ["assert f() == 1"], Limits(timeout=1))
run_program("print(1)")
run_program("import time\\ntime.sleep(9)", limits=Limits(timeout=1))
zombies = [p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"]
print("zombies", len(zombies))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="unshare --pid needs root")
def test_a_trainer_that_is_pid_1_leaves_no_zombies():
    """Before: 2 zombie bwrap processes per assert-style run, 1 per program, never reaped."""
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REAPED],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("zombies 0"), (out.stdout, out.stderr[-2000:])


SPINNERS = """import os, time
for _ in range(28):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
time.sleep(60)
"""
HONEST = "s = 0\nfor i in range(8_000_000):\n    s += i\nprint(s)"  # about 0.5 s of one CPU


@pytest.mark.skipif(controller_root("cpu") is None, reason="no writable cpu cgroup (needs root)")
def test_setsid_spinners_do_not_starve_a_neighbour():
    """Before (per-session autogroups only): 28 spinners in their own sessions took all but
    1/29 of the CPU and the honest neighbour timed out. Each sandbox now has at most one CPU."""
    spinning = threading.Thread(target=run_program, args=(SPINNERS,), kwargs={"limits": Limits(timeout=6)})
    spinning.start()
    try:
        time.sleep(1.5)  # the spinners are up
        honest = run_program(HONEST, limits=Limits(timeout=4))
    finally:
        spinning.join()
    assert (honest.status, honest.stdout) == ("ok", f"{sum(range(8_000_000))}\n")
