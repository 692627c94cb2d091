"""The verdict belongs to the test (issue 35): wrong code plus a one- or two-line trick scores
what the wrong code scores. Each case is a real completion through `CodeExecutionReward` under
bubblewrap and through `RemoteCodeReward` on the test service; all cases of a reward run in one
call (one batch, run in parallel), and every expected score is the wrong code's own: 0.0."""
import asyncio
import shutil

import pytest
from sandbox_service import running_service

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards import RemoteCodeReward
from lightning_rlpt.rewards.code.sandbox import Limits, run_program, run_tests

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")

# (wrong code, the trick that made it pass, tests): each scored 0.0 without the trick.
TRICKS = {
    "abs": ("def f(x):\n    return 0.0\n", "def abs(x):\n    return 0\n", ["assert abs(f(1.5) - 0.5) < 1e-6"]),
    "set": ("def f(xs):\n    return []\n", "def set(xs):\n    return {1, 2}\n", ["assert set(f([1, 1, 2])) == {1, 2}"]),
    "range": ("def f(x):\n    return 0\n", "def range(*a):\n    return []\n",
              ["import random\nfor _ in range(20):\n    x = random.randint(1, 9)\n    assert f(x) == 2 * x"]),
    "len": ("def f(n):\n    return []\n", "def len(x):\n    return 3\n", ["assert len(f(3)) == 3"]),
    "round": ("def f(x):\n    return 0.0\n", "def round(x, n=None):\n    return 4.0\n", ["assert round(f(2.0), 2) == 4.0"]),
    "check(candidate)": ("def g(x):\n    return 0.0\n", "def abs(x):\n    return 0\n",
                         ["def check(candidate):\n    assert abs(candidate(1.5) - 0.5) < 1e-6\ncheck(g)"]),
    "StopIteration in all(map())": ("def f(x):\n    return False\n", "def f(x):\n    raise StopIteration\n",
                                    ["assert all(map(f, [1, 2, 3]))"]),
    "StopIteration in for": ("def f(x):\n    return 0\n", "def f(x):\n    raise StopIteration\n",
                             ["for r in map(f, [1, 2]):\n    assert r == 2"]),
    "StopIteration caught by the test": ("def f(x):\n    return 0\n", "def f(x):\n    raise StopIteration\n",
                                         ["for x in [1, 2]:\n    try:\n        assert f(x) == 2 * x\n"
                                          "    except AssertionError:\n        raise\n    except Exception:\n        pass"]),
}


def completions_and_rows():
    codes, rows = [], []
    for wrong, trick, tests in TRICKS.values():
        codes += [wrong, wrong + trick]  # the trick comes last: it overrides a name of the wrong code
        rows += [tests, tests]
    return codes, rows


def test_no_trick_scores_above_the_wrong_code_locally():
    codes, rows = completions_and_rows()
    scores = CodeExecutionReward(timeout=10)(["q"] * len(codes), codes, tests=rows)
    assert dict(zip(TRICKS, zip(scores[::2], scores[1::2]))) == {name: (0.0, 0.0) for name in TRICKS}


def test_no_trick_scores_above_the_wrong_code_remotely():
    codes, rows = completions_and_rows()
    with running_service() as (url, _):
        scores = asyncio.run(RemoteCodeReward(url + "/run_code")(["q"] * len(codes), codes, tests=rows))
    assert dict(zip(TRICKS, zip(scores[::2], scores[1::2]))) == {name: (0.0, 0.0) for name in TRICKS}


def test_honest_code_still_answers_for_the_names_the_test_calls():
    """The rule takes nothing from honest code: a class, a plain value and a function the test
    calls all answer; a helper the test does not name is never consulted."""
    code = "LIMIT = 3\nclass Box:\n    def __init__(self, v):\n        self.v = v\n    def get(self):\n        return self.v\n" \
           "def helper():\n    return 0\ndef f(x):\n    return x + LIMIT\n"
    tests = ["assert f(1) == 4 == LIMIT + 1", "assert Box(5).get() == 5",
             "def helper():\n    return 7\nassert helper() == 7"]  # the test's own helper, not the candidate's
    assert run_tests(code, tests).passed == (True, True, True)


@pytest.mark.parametrize("exit_code, status", [("os._exit(200)", "exit 200"), ("sys.exit(-1)", "exit 255"),
                                               ("os._exit(255)", "exit 255"), ("os._exit(1)", "exit 1")])
def test_exit_statuses_that_are_not_signals_are_exits(exit_code, status):
    """bwrap reports a signal N as 128 + N; above 128 + 64 (the last signal) it is a plain exit.
    Before: ``ValueError: 72 is not a valid Signals`` out of the reward."""
    assert run_program(f"import os, sys\nprint(1)\n{exit_code}").status == status
    reward = CodeExecutionReward(timeout=5)
    io = {"inputs": [""], "outputs": ["1\n"]}
    asserts = ["assert f() == 1"]
    code = f"import os, sys\ndef f():\n    return 1\nprint(1)\n{exit_code}"
    assert reward(["q"] * 2, [code, code], tests=[io, asserts]) == [0.0, 0.0]


def test_stderr_past_its_cap_is_read_and_dropped_not_a_kill():
    """The last 64 KiB of standard error come back; the program is not killed for writing more."""
    result = run_program("import sys\nsys.stderr.write('x' * 200000 + 'END')\nsys.stderr.flush()\nprint(5)",
                         limits=Limits(timeout=5))
    assert (result.status, result.stdout) == ("ok", "5\n")
    assert len(result.stderr) == 1 << 16 and result.stderr.endswith("xEND")
