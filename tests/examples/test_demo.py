"""The main demo, shortened: GRPO raises held-out accuracy and writes its CSV and PNG."""
import os
import sys

from conftest import ARITHMETIC

sys.path.insert(0, ARITHMETIC)  # this test exercises the example itself
import run  # noqa: E402  (examples/arithmetic/run.py)


def test_short_demo_improves_held_out_accuracy(tmp_path):
    result = run.main(["--steps", "30", "--out", str(tmp_path)])
    assert result["before"] < 0.40  # the shipped warm start leaves room
    assert result["after"] - result["before"] >= 0.10, result
    assert os.path.getsize(tmp_path / "metrics.csv") > 0
    assert os.path.getsize(tmp_path / "curves.png") > 10_000
