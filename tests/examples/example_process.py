"""Run an example script as a user would: its own process, output in a folder of the test's."""
import os
import subprocess
import sys

from conftest import ROOT


def run_example(script: str, args: list[str], out, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python examples/<script> <args> --out <out>`` from ``out``; fails the test on a non-zero exit."""
    # One thread: the models are tiny, and on a shared CPU two spinning threads make them ~20x slower.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args, "--out", str(out)],
                          env=env, cwd=str(out), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
