"""The README's quickstart, run as written: its Python blocks, in order, from a directory laid out
like the clone's root. The first trains on the built-in HF engine, the second on vLLM's CPU build;
each writes the metrics the README points to, and vLLM samples from the trainer's policy."""
import csv
import os
import re
import subprocess
import sys

from conftest import ROOT


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, "README.md")).read(), re.S)


def test_the_readme_has_a_short_quickstart_and_then_its_vllm_variant():
    blocks = readme_blocks()
    assert len(blocks) == 2 and len(blocks[0].splitlines()) <= 20, [len(b.splitlines()) for b in blocks]
    assert "VLLMRollout" not in blocks[0] and "VLLMRollout()" in blocks[1]


def test_the_readme_quickstart_runs_as_written(tmp_path):
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")  # its paths are the clone's
    (tmp_path / "quickstart.py").write_text("\n".join(readme_blocks()))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a tiny model: more threads only spin on 2 cores
    proc = subprocess.run([sys.executable, "quickstart.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("quickstart", "quickstart-vllm"):
        with open(tmp_path / "runs" / name / "version_0" / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["step"]) for r in rows] == [4, 9, 14, 19, 24, 29], name  # log_every_n_steps=5, 30 steps
        assert all(0.0 <= float(r["reward"]) <= 1.0 for r in rows), name
    # vLLM's sampling log-probs are the trainer's, step by step (the tied-head class of bug shows here)
    assert max(float(r["sampling/logp_diff/max"]) for r in rows) < 1e-3
    # and a plain run prints none of the reload noise that reads like that bug (lightning_rlpt/quiet.py)
    assert "Failed to load" not in proc.stdout + proc.stderr, re.findall(r".*Failed to load.*", proc.stderr)[:3]
