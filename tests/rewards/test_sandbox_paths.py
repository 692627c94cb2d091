"""The sandbox works wherever the interpreter lives, /tmp included: a CI clone under /tmp has its
virtualenv there, and bubblewrap's private /tmp used to be mounted over it (every run failed to
start its interpreter, so every completion scored 0)."""
import shutil
import subprocess
import sys

import pytest

from lightning_rlpt.rewards.code.sandbox import run_program

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")


def test_an_interpreter_under_tmp_runs_in_the_sandbox(tmp_path):
    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    result = run_program("print(sum(map(int, input().split())))", "2 3", python=str(venv / "bin" / "python"))
    assert (result.status, result.stdout) == ("ok", "5\n")
