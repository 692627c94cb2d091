"""Correct code scores 1.0 whatever everyday type it returns (issue 35): each solution below is
right by Python's own reading of its test (checked in this process first), and scored under
bubblewrap in one batch. The clean side still rebuilds only builtin values (`sandbox_codec.decode`)."""
import shutil

import pytest

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards.code.sandbox import run_tests
from lightning_rlpt.rewards.code.sandbox_codec import CannotCross, dumps, loads

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")

CORRECT = {
    "Counter": ("from collections import Counter\ndef f(s):\n    return Counter(s)", "assert f('aab') == {'a': 2, 'b': 1}"),
    "defaultdict": ("from collections import defaultdict\ndef f(xs):\n    d = defaultdict(list)\n"
                    "    for x in xs:\n        d[x % 2].append(x)\n    return d", "assert f([1, 2, 3]) == {1: [1, 3], 0: [2]}"),
    "namedtuple": ("from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f():\n    return P(1, 2)",
                   "assert f() == (1, 2)"),
    "np.mean": ("import numpy as np\ndef f(xs):\n    return np.mean(xs)", "assert abs(f([1, 2, 3, 4]) - 2.5) < 1e-9"),
    "np.isclose": ("import numpy as np\ndef f(a, b):\n    return np.isclose(a, b)", "assert f(1.0, 1.0 + 1e-12) == True"),
    "list(ndarray)": ("import numpy as np\ndef f(n):\n    return list(np.arange(n) * 2)", "assert f(3) == [0, 2, 4]"),
    "generator": ("def f(n):\n    return (i * i for i in range(n))", "assert list(f(3)) == [0, 1, 4]"),
    "map": ("def f(xs):\n    return map(abs, xs)", "assert sorted(f([-2, 1])) == [1, 2]"),
    "instance data": ("class Node:\n    def __init__(self, val):\n        self.val = val\n        self.next = None\n"
                      "    def double(self):\n        return 2 * self.val",
                      "n = Node(3)\nassert n.val == 3 and n.next is None and n.double() == 6"),
    "exception subclass": ("class Bad(ValueError):\n    pass\ndef f(x):\n    if x < 0:\n        raise Bad('negative')\n    return x",
                           "try:\n    f(-1)\nexcept ValueError as err:\n    assert 'negative' in str(err)\nelse:\n    raise AssertionError"),
    "fact(2000)": ("def fact(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r",
                   "import math\nassert fact(2000) == math.factorial(2000)"),
    "nesting 500": ("def f(n):\n    x = []\n    for _ in range(n):\n        x = [x]\n    return x",
                    "y = []\nfor _ in range(500):\n    y = [y]\nassert f(500) == y"),
    "range": ("def f(n):\n    return range(n)", "assert list(f(3)) == [0, 1, 2] and f(3) == range(3)"),
}


def test_correct_code_scores_one_whatever_everyday_type_it_returns():
    for name, (code, test) in CORRECT.items():  # right in one process, as a plain harness would run it
        exec(code + "\n" + test, {})
    codes, tests = zip(*CORRECT.values())
    scores = CodeExecutionReward(timeout=20)(["q"] * len(codes), list(codes), tests=[[t] for t in tests])
    assert dict(zip(CORRECT, scores)) == {name: 1.0 for name in CORRECT}


def test_a_big_int_fails_no_later_test():
    """Before, ``json.dumps`` of a 5,736-digit int (past Python's 4,300-digit str limit) killed the
    candidate's process, and the next test failed with it: (False, False)."""
    code = "import math\ndef fact(n):\n    return math.factorial(n)\ndef one():\n    return 1"
    assert run_tests(code, ["assert fact(2000) > 0", "assert one() == 1"]).passed == (True, True)


def test_what_still_does_not_cross_fails_its_call():
    """An object of the candidate's own class (not instantiated by the test) and a function do not
    cross: the call fails, even inside ``try/except Exception``."""
    code = "class Yes:\n    def __eq__(self, o):\n        return True\ndef f():\n    return Yes()\ndef g():\n    return len"
    tests = ["assert f() == 1", "try:\n    assert g() is not None\nexcept Exception:\n    pass"]
    assert run_tests(code, tests).passed == (False, False)


def test_the_clean_side_decodes_only_builtins():
    assert type(loads(dumps(True))) is bool and loads(dumps(10 ** 5000)) == 10 ** 5000
    for forged in ['{"$int":"zz"}', '{"$range":[1,2,0]}', '{"$iter":3}', '{"$Yes":[]}', '[' * 5000 + ']' * 5000]:
        with pytest.raises(CannotCross):
            loads(forged)


def test_code_that_does_not_load_says_why():
    """A body without its prompt, or a module missing from the sandbox: scored 0, and the reason is
    kept (before, it was computed in the sandbox and thrown away)."""
    reward = CodeExecutionReward(timeout=10)
    codes = ["    return sum(xs)\n", "import no_such_module_here\ndef f(xs):\n    return 0\n"]
    with pytest.warns(UserWarning, match=r"none of the 2 completions loaded.*IndentationError.*code_prefix='prompt'"):
        assert reward(["q"] * 2, codes, tests=[["assert f([1]) == 1"]] * 2) == [0.0, 0.0]
    assert reward.load_errors[0].startswith("IndentationError: unexpected indent")
    assert reward.load_errors[1] == "ModuleNotFoundError: No module named 'no_such_module_here'"
    assert run_tests("def f(xs):\n    return 1", ["assert f([1]) == 1"]).error == ""


def test_the_number_that_did_not_load_is_logged(warm_start_dir, arithmetic_rows, tmp_path):
    """``rewards/<name>/load_errors``: the module logs a reward's own counts of its last call
    (`RewardFunctions.call_counts`), summed over ranks. The tiny model's completions (digits) after
    the prefix ``def f(x):`` are a function without an indented body: none loads."""
    from lightning.pytorch.loggers import CSVLogger

    from conftest import quiet_trainer
    from lightning_rlpt import PromptDataModule, RLModule
    from resume_utils import read_rows

    reward = CodeExecutionReward(timeout=10, code_prefix="head")
    rows = [{**row, "tests": ["assert f(1) == 1"], "head": "def f(x):\n"} for row in arithmetic_rows[:4]]
    module = RLModule(warm_start_dir, reward_funcs=[reward], group_size=2, kl_coef=0.0, parity_every=0,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    logger = CSVLogger(str(tmp_path), name="")
    quiet_trainer(max_steps=1, logger=logger).fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    logged = read_rows(logger.log_dir)[0]
    did_not_load = sum(map(bool, reward.load_errors))
    assert did_not_load == 8 and logged["rewards/code/load_errors"] == 8
