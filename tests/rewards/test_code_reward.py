"""The code-execution reward: real sandboxes, real limits. (The review's attacks, no network included:
test_sandbox_attacks.py; the two test formats and the sandbox's refusals: test_sandbox_formats.py.)"""
import pickle
import shutil
import time

import pytest

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards import RewardError, RewardFunctions
from lightning_rlpt.rewards.code import SandboxLimitError, extract_code
from lightning_rlpt.rewards.code.sandbox import Limits, run_tests

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
LOOP = "while True:\n    pass"


def call(reward, completions, tests=ADD_TESTS):
    return reward(["q"] * len(completions), completions, tests=[tests] * len(completions))
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")


def test_scores_are_the_fraction_of_tests_passed():
    reward = CodeExecutionReward(timeout=5, max_workers=2)
    completions = [
        "Here:\n```python\ndef add(a, b):\n    return a + b\n```",           # all 3
        "def add(a, b):\n    return a - b",                                    # raw text: 0 of 3
        "```python\ndef add(a, b): return 0\n```\nfixed:\n```py\ndef add(a, b): return a * b + (a == 1) * 1\n```",
        "def add(a, b) return a + b",                                          # syntax error: 0
        [{"role": "assistant", "content": "```\ndef add(a, b): return a + b\n```"}],  # conversational, unlabelled fence
    ]
    # a - b: -1, 0, -2: none right.  The last block a*b + (a == 1): 3 and 4 right, -1 for add(-1, 1): 2 of 3
    assert call(reward, completions) == pytest.approx([1.0, 0.0, 2 / 3, 0.0, 1.0])
    binary = CodeExecutionReward(timeout=5, binary=True)
    assert call(binary, [completions[0], completions[2]]) == [1.0, 0.0]


def test_tests_share_the_code_namespace_and_a_string_is_one_test():
    reward = CodeExecutionReward(timeout=5)
    program = "def check(f):\n    assert f(2, 3) == 5\n    assert f(0, 0) == 0\ncheck(add)"  # HumanEval style
    assert reward(["q"] * 2, ["def add(a, b): return a + b", "def add(a, b): return 5"],
                  tests=[program, program]) == [1.0, 0.0]
    # `if __name__ == "__main__":` blocks do not run: the code is loaded as a module named __solution__
    assert call(reward, ["def add(a, b): return a + b\nif __name__ == '__main__':\n    raise SystemExit(1)"]) == [1.0]


def test_extract_code_takes_the_last_python_block():
    assert extract_code("```bash\nls\n```\n```python\na = 1\n```\n```python3\nb = 2\n```") == "b = 2\n"
    assert extract_code("```bash\nls\n```") == "```bash\nls\n```"  # no Python block: the raw text
    assert extract_code("no fences") == "no fences"


def test_an_infinite_loop_is_killed_at_the_timeout():
    reward = CodeExecutionReward(timeout=1.5, max_workers=2)
    start = time.monotonic()
    with pytest.raises(SandboxLimitError, match=r"1 of 2 completions was killed \(sample 1 ran past timeout=1.5s\)"):
        call(reward, ["def add(a, b): return a + b", LOOP])
    assert time.monotonic() - start < 1.5 + 3  # killed, not waited for


def test_killed_samples_are_scored_per_reward_on_error():
    """(That each completion's code runs once: test_sandbox_attacks.py.)"""
    completions = ["def add(a, b): return a + b", LOOP, "def add(a, b): return abs(a) + b"]
    zero = RewardFunctions([CodeExecutionReward(timeout=2, max_workers=2)], on_error="zero")
    scores, failures = zero(["q"] * 3, completions, {"tests": [ADD_TESTS] * 3})
    assert scores[:, 0].tolist() == pytest.approx([1.0, 0.0, 2 / 3])  # abs(a) + b gets add(-1, 1) wrong
    assert failures == {"code": 1}
    strict = RewardFunctions([CodeExecutionReward(timeout=2, max_workers=2)])
    with pytest.raises(RewardError, match=r"'code' raised SandboxLimitError: the code was killed: it ran past timeout=2s.* on sample 1 .*"
                                          r"reward_on_error='zero'"):
        strict(["q"] * 3, completions, {"tests": [ADD_TESTS] * 3})


@pytest.mark.parametrize("code", [
    "x = bytearray(10**11)",                                          # one allocation far past the limit
    "x = []\nwhile True:\n    x.append(bytearray(10**6))",            # growth without bound
])
def test_memory_is_limited(code):
    start = time.monotonic()
    outcome = run_tests(code, ["assert True"], Limits(timeout=20, memory_mb=256))
    assert outcome.status == "memory" and outcome.killed
    assert time.monotonic() - start < 10  # stopped by the memory limit, long before the timeout
    with pytest.raises(SandboxLimitError, match="the code was killed: it went past memory_mb=256"):
        call(CodeExecutionReward(timeout=20, memory_mb=256), [code], ["assert True"])


def test_limits_on_files_environment_cpu_and_output(monkeypatch):
    monkeypatch.setenv("RLPT_TEST_SECRET", "token")
    code = ("import os, resource\nprint('x' * 10**7)\ntry:\n    open('big', 'wb').write(b'x' * (4 << 20))\n    wrote = True\n"
            "except OSError:\n    wrote = False\nsize = os.path.getsize('big')\nenv = sorted(os.environ)\n"
            "limits = [resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) for n in ('CPU', 'AS', 'NPROC')]\n")
    outcome = run_tests(code, ["assert not wrote", "assert size <= 1 << 20", "assert 'RLPT_TEST_SECRET' not in env",
                               "assert limits[0] == (12, 13)",  # 10.5 s rounded up, plus 1; SIGKILL a second later
                               "assert limits[1] == (300 << 20, 300 << 20)", "assert limits[2] == (9, 9)"],
                        Limits(timeout=10.5, memory_mb=300, max_file_mb=1, max_processes=9))
    assert outcome.passed == (True,) * 6


def test_bad_tests_are_refused_before_any_code_runs():
    ran = []

    class Counting(CodeExecutionReward):
        def _run(self, key):
            ran.append(key)
            return super()._run(key)

    completion = "def add(a, b): return a + b"
    reward = Counting(timeout=5)
    with pytest.raises(KeyError, match=r"column 'tests', but the batch has \['test_list'\].*columns=\{'test_list'"):
        reward(["q"], [completion], test_list=[ADD_TESTS])
    for bad in ([], [""], [3], None, {"inputs": ["1"], "outputs": []}, [{"input": "1"}]):
        with pytest.raises(ValueError, match=r"row 1 of column 'tests' is .*give a non-empty list of Python test snippets.*"
                                             r"or stdin/stdout cases"):
            reward(["q", "q"], [completion] * 2, tests=[ADD_TESTS, bad])
    assert ran == []
    assert CodeExecutionReward(tests_column="test_list")(["q"], ["def add(a, b): return a + b"],
                                                         test_list=[ADD_TESTS]) == [1.0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(timeout=0), "timeout must be > 0"),
    (dict(memory_mb=16), "memory_mb=16 is too small"),
    (dict(max_workers=0), "max_workers must be >= 1"),
    (dict(sandbox="docker"), r"sandbox must be one of \('bwrap', 'local-unsafe'\)"),
    (dict(compare="fuzzy"), r"compare must be one of \('lines', 'exact'\)"),
    (dict(max_processes=1), "max_processes >= 4"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CodeExecutionReward(**kwargs)


def test_pickles_and_is_named_code():
    reward = CodeExecutionReward(timeout=3, binary=True)
    copy = pickle.loads(pickle.dumps(reward))
    assert (copy.timeout, copy.binary, copy.__name__) == (3, True, "code")
    assert RewardFunctions(["lightning_rlpt.rewards.library:code_reward"]).names == ["code"]  # configs name it so
    assert call(copy, ["def add(a, b): return a + b"]) == [1.0]


def test_in_a_training_step_with_the_length_penalty(llama_dir, arithmetic_rows):
    """The tests column reaches the reward through the datamodule; with the test ``assert True``
    a completion scores 1.0 exactly when its text runs as Python (``12+3`` does, ``1=2`` does not).
    The length penalty, computed from the same scores, matches Kimi's formula by hand per group."""
    from conftest import quiet_trainer
    from lightning_rlpt import LengthPenalty, PromptDataModule, RLCallback, RLModule

    seen = []

    class Keep(RLCallback):
        def on_rollout_scored(self, trainer, module, experience):
            seen.append(experience)

    rows = [{**row, "tests": ["assert True"]} for row in arithmetic_rows]
    code = CodeExecutionReward(timeout=10, max_workers=2)
    module = RLModule(llama_dir, reward_funcs=[code, LengthPenalty(code)], group_size=4, seed=3,
                      generation=dict(max_new_tokens=6, max_prompt_length=8))
    trainer = quiet_trainer(max_steps=1, callbacks=[Keep()])
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2))
    exp = seen[0]

    def runs(text):
        try:
            exec(compile(text, "<completion>", "exec"), {})
            return 1.0
        except Exception:
            return 0.0
    by_hand = [runs(c) for c in exp.completions]
    assert 0 < sum(by_hand) < len(by_hand), exp.completions  # both kinds, or the check proves little
    assert exp.rewards_per_func[:, 0].tolist() == by_hand
    assert trainer.callback_metrics["rewards/code/mean"].item() == pytest.approx(sum(by_hand) / len(by_hand))
    lengths = exp.completion_mask.sum(1).tolist()
    expected = []
    for g in range(2):
        group = lengths[4 * g:4 * g + 4]
        lo, hi = min(group), max(group)
        for n, ok in zip(group, by_hand[4 * g:4 * g + 4]):
            lam = 0.0 if hi == lo else 0.5 - (n - lo) / (hi - lo)
            expected.append(lam if ok else min(0.0, lam))
    assert exp.rewards_per_func[:, 1].tolist() == pytest.approx(expected)
