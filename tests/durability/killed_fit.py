"""A fit of tests/core/test_resume_points.py's run, in its own process, for a test to SIGKILL:

    python killed_fit.py ROOT STEPS
"""
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [TESTS, os.path.join(TESTS, "core")]

import tiny_task as task  # noqa: E402
from conftest import ARITHMETIC  # noqa: E402
from test_resume_points import builders, fit_part  # noqa: E402

if __name__ == "__main__":
    train, held = task.split_pairs()
    setting = builders(os.path.join(ARITHMETIC, "warm_start"), task.rows(train[:64]), task.rows(held[:32]))
    fit_part(setting, sys.argv[1], 0, int(sys.argv[2]), every=1)
