"""A generated attack corpus (issue 35): every builtin name shadowed, every builtin exception class
raised across the proxy, every exit status 0-255, output sizes around each cap. The property:
wrong code plus any trick never scores above the same wrong code without it. Cases are batched
(one sandbox pair holds a test per builtin name) so the corpus costs seconds, not minutes."""
import builtins
import keyword
import shutil

import pytest

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards import RewardFunctions
from lightning_rlpt.rewards.code.sandbox import Limits, run_program, run_tests
from lightning_rlpt.rewards.code.sandbox_inside import MEMORY_EXIT
from lightning_rlpt.rewards.code.sandbox_launch import LAST_SIGNAL

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")
NAMES = sorted(n for n in dir(builtins) if not n.startswith("__") and not keyword.iskeyword(n))
EXCEPTIONS = sorted(n for n in NAMES if isinstance(getattr(builtins, n), type)
                    and issubclass(getattr(builtins, n), BaseException))
WRONG = "def f(x):\n    return 0\n"
# Tests of f(x) == 2 * x, in the shapes tests take: direct, in loops, in map/all/any, in comprehensions.
F_TESTS = ["assert f(1) == 2", "assert all(f(x) == 2 * x for x in [1, 2])", "assert all(map(lambda x: f(x) == 2 * x, [1, 2]))",
           "for r in map(f, [1, 2]):\n    assert r in (2, 4)", "assert list(map(f, [1, 2])) == [2, 4]",
           "assert [f(x) for x in (1,)] == [2]", "assert not any(f(x) != 2 * x for x in [1])", "assert sum(map(f, [1])) == 2"]


def test_no_builtin_name_can_be_shadowed():
    """One test per builtin name, passing only if the candidate's name replaced the builtin in the
    tests' globals; the candidate defines all of them, as functions and then as values."""
    probes = [f"import builtins\nassert {n} is not builtins.{n}" for n in NAMES]
    as_functions = WRONG + "".join(f"def {n}(*a, **k):\n    return 1\n" for n in NAMES)
    as_values = WRONG + "".join(f"{n} = 1\n" for n in NAMES)
    assert len(NAMES) > 140
    for code in (WRONG, as_functions, as_values):
        assert run_tests(code, probes + F_TESTS, Limits(timeout=20)).passed == (False,) * (len(NAMES) + len(F_TESTS))


def raising(name: str) -> str:
    return (f"import builtins\ndef f(x):\n    E = builtins.{name}\n    try:\n        e = E('no')\n"
            "    except TypeError:\n        e = E.__new__(E)\n    raise e\n")


def test_no_builtin_exception_raised_across_the_proxy_scores():
    """MemoryError reads as the memory limit (no score: counted as a failure under 'zero')."""
    assert len(EXCEPTIONS) > 60
    codes = [WRONG] + [raising(n) for n in EXCEPTIONS]
    zero = RewardFunctions([CodeExecutionReward(timeout=10)], on_error="zero")
    scores, failures = zero(["q"] * len(codes), codes, {"tests": [F_TESTS] * len(codes)})
    assert dict(zip(["wrong"] + EXCEPTIONS, scores[:, 0].tolist())) == {n: 0.0 for n in ["wrong"] + EXCEPTIONS}
    assert failures == {"code": 1}


def expected_status(n: int) -> str:
    """bwrap reports signal N as 128 + N: statuses up to 128 + 64 read as that signal (no score)."""
    if n == 0:
        return "ok"
    if n == MEMORY_EXIT:  # the inside runner's report of a MemoryError
        return "memory"
    return f"exit {n}" if not 128 < n <= 128 + LAST_SIGNAL else "killed"


def test_every_exit_status_scores_nothing_and_runs_once():
    """A wrong answer printed, then ``os._exit(n)`` for every n: never above 0, never a crash of
    the reward, each completion run once under reward_on_error='zero' (a killed one counted)."""
    runs = []

    class Counting(CodeExecutionReward):
        def _run(self, key):
            runs.append(key[0])
            return super()._run(key)

    codes = [f"import os, sys\nprint(4)\nsys.stdout.flush()\nos._exit({n})" for n in range(256)]
    rows = [{"inputs": [""], "outputs": ["3\n"]}] * 256
    scores, failures = RewardFunctions([Counting(timeout=5)], on_error="zero")(["q"] * 256, codes, {"tests": rows})
    assert scores[:, 0].tolist() == [0.0] * 256 and sorted(runs) == sorted(codes)
    assert failures == {"code": LAST_SIGNAL + 1}  # 129..192 read as a signal; 3 as the memory limit (MEMORY_EXIT)
    for n in (0, 1, 3, 127, 128, 129, 137, 192, 193, 200, 255):  # the status itself, and in the candidate's process
        assert run_program(f"import os\nos._exit({n})").status.startswith(expected_status(n))
        outcome = run_tests(f"import os\ndef f(x):\n    os._exit({n})", F_TESTS[:2])
        assert outcome.passed == (False, False) and outcome.status.startswith(
            expected_status(n) if expected_status(n) in ("killed", "memory") else "ok")  # an exit: its calls failed


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_around_each_cap(stream):
    """The right answer, padded to the cap and past it: standard output past its cap
    fails the case (the writer is killed), standard error never does; a wrong answer never passes."""
    cap = 1 << 16  # max_output_mb=0.0625 for stdout; stderr's cap is 64 KiB
    reward = CodeExecutionReward(timeout=10, max_output_mb=cap / (1 << 20))
    codes, expected = [], []
    for answer, right in (("3", 1.0), ("4", 0.0)):
        for size in (cap - 1, cap, cap + 1, 4 * cap):
            pad = size - 2 if stream == "stdout" else size  # "3\n" is part of standard output's size
            codes.append(f"import sys\nprint({answer})\nsys.stdout.flush()\nsys.{stream}.write(' ' * {pad})")
            expected.append(right if stream == "stderr" or size <= cap else 0.0)
    rows = [{"inputs": [""], "outputs": ["3\n"]}] * len(codes)
    assert reward(["q"] * len(codes), codes, tests=rows) == expected
