"""examples/math_rl.py runs as a script: 2 steps, both library rewards logged under their names."""
import csv
import os
import subprocess
import sys

from conftest import ROOT


def test_math_rl_example_runs(tmp_path):
    # One thread: the model is tiny, and on a shared CPU two spinning threads make it ~20x slower.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "math_rl.py"), "--steps", "2",
                           "--out", str(tmp_path)], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rewards/math_answer/mean" in proc.stdout
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["0", "1"]
    for name in ["reward", "rewards/math_answer/mean", "rewards/format/mean", "rewards/math_answer/failures"]:
        assert all(r[name] != "" for r in rows), name
    # A random policy writes noise: no reward function failed on it, and no score is out of [0, 1]
    assert all(float(r["rewards/math_answer/failures"]) == 0 and 0 <= float(r["reward"]) <= 1.2 for r in rows)
