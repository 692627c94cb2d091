"""The main demo, shortened: GRPO raises held-out accuracy and writes its CSV and PNG; and the
demo's split keeps every unordered pair (``a+b`` with ``b+a``) on one side of train / dev / test."""
import os
import sys

from conftest import ARITHMETIC

sys.path.insert(0, ARITHMETIC)  # this test exercises the example itself
import run  # noqa: E402  (examples/arithmetic/run.py)
import task  # noqa: E402  (examples/arithmetic/task.py)


def test_no_unordered_pair_crosses_train_dev_test():
    train, dev, test = task.split_pairs_with_dev()
    assert (len(dev), len(test)) == (task.DEV, task.HELD_OUT) == (200, 300)
    sides = [{task.unordered(p) for p in side} for side in (train, dev, test)]
    assert not sides[0] & sides[1] and not sides[0] & sides[2] and not sides[1] & sides[2]
    assert len(sides[1]) == len(dev) and len(sides[2]) == len(test)  # one sum per held-out unordered pair
    assert set(train) == {p for p in task.all_pairs() if task.unordered(p) in sides[0]}  # both orders of each
    held_mirrors = {(b, a) for a, b in dev + test}
    assert not held_mirrors & set(train)
    assert len(set(train) | set(dev) | set(test) | held_mirrors) == len(task.all_pairs())  # nothing else is dropped
    # the 2-tuple API the other scripts and tests use is the same split; dev_pairs is its dev set
    assert task.split_pairs() == (train, test) and task.dev_pairs() == dev
    assert task.split_pairs_with_dev(1) != task.split_pairs_with_dev(0)


def test_short_demo_improves_held_out_accuracy(tmp_path):
    result = run.main(["--steps", "30", "--out", str(tmp_path)])
    assert result["before"] < 0.40  # the shipped warm start leaves room
    assert result["after"] - result["before"] >= 0.10, result
    assert os.path.getsize(tmp_path / "metrics.csv") > 0
    assert os.path.getsize(tmp_path / "curves.png") > 10_000


def test_the_report_names_the_held_out_count_the_task_has():
    import demo_report  # noqa: E402  (examples/arithmetic/demo_report.py: imports nothing heavy)

    assert demo_report.HELD_OUT == task.HELD_OUT
