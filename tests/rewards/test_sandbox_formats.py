"""The code reward's two test formats (assert-style through proxies, stdin/stdout compared in the
trainer), the strict serializer, untrusted verdicts, and the refusal where bubblewrap is missing."""
import shutil

import pytest

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards import RewardFunctions
from lightning_rlpt.rewards.code import SandboxLimitError
from lightning_rlpt.rewards.code.sandbox import Limits, run_program, run_tests, verdict
from lightning_rlpt.rewards.code.sandbox_codec import CannotCross, dumps, loads
from lightning_rlpt.rewards.code.sandbox_launch import SandboxUnavailable

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")
SUM = "a, b = map(int, input().split())\nprint(a + b)"


@needs_bwrap
def test_stdin_stdout_cases_are_compared_in_the_trainer():
    cases = {"inputs": ["1 2\n", "5 5\n", "0 0\n"], "outputs": ["3\n", "10\n", "0"]}
    as_list = [{"input": i, "output": o} for i, o in zip(cases["inputs"], cases["outputs"])]
    reward = CodeExecutionReward(timeout=5, max_workers=2)
    completions = [SUM, "print(3)", "print(int(input().split()[0]) + int(input().split()[1]))",  # reads past EOF: exit 1
                   "a, b = map(int, input().split())\nprint(a + b, '  ')\nprint()"]             # trailing blanks
    assert reward(["q"] * 4, completions, tests=[cases, as_list, cases, cases]) == pytest.approx([1.0, 1 / 3, 0.0, 1.0])
    exact = CodeExecutionReward(timeout=5, compare="exact")
    assert exact(["q"] * 2, [SUM, completions[3]], tests=[cases, cases]) == pytest.approx([2 / 3, 0.0])  # "0" has no \n


@needs_bwrap
def test_run_program_caps_output_and_kills_at_limits():
    flood = run_program("while True:\n    print('x' * 65536)", limits=Limits(timeout=10, max_output_mb=0.5))
    assert flood.status == "output" and len(flood.stdout) == 1 << 19 and not flood.killed
    assert run_program("while True: pass", limits=Limits(timeout=1)).status == "timeout"
    assert run_program("x = bytearray(10**10)", limits=Limits(memory_mb=128)).status == "memory"
    crash = run_program("raise ValueError('boom')")
    assert crash.status == "exit 1" and "ValueError: boom" in crash.stderr
    reward = CodeExecutionReward(timeout=10, max_output_mb=0.5)
    assert reward(["q"], ["while True:\n    print('3')"], tests=[{"inputs": [""], "outputs": ["3"]}]) == [0.0]


@needs_bwrap
def test_proxies_classes_exceptions_and_plain_values_cross():
    code = ("class Solution:\n    def two_sum(self, xs, t):\n        return [0, 1] if xs[0] + xs[1] == t else None\n"
            "def pair(x):\n    return (x, {x: {x}})\ndef fail(x):\n    raise ValueError('no')\nLIMIT = 3\n"
            "def custom():\n    return type('Int', (int,), {'__eq__': lambda s, o: True})(3)\n"
            "def forged():\n    return type('Yes', (), {'__eq__': lambda s, o: True})()\n")
    tests = ["assert Solution().two_sum([1, 2], 3) == [0, 1]",
             "assert pair(2) == (2, {2: {2}})",                            # tuples, dicts with int keys, sets
             "try:\n    fail(1)\nexcept ValueError as e:\n    assert str(e) == 'no'",  # the candidate's exception, by type
             "assert LIMIT == 3",
             "assert custom() == 3 and custom() != 4",                      # an int subclass crosses as its int
             "assert forged() == 3",                                        # any other object cannot cross
             "assert Solution()",                                           # an object of the candidate has no truth value
             "assert pair(lambda: 0)"]                                      # nor can a function be sent
    assert run_tests(code, tests, Limits(timeout=10)).passed == (True, True, True, True, True, False, False, False)


def test_the_serializer_is_strict():
    """Strict where it matters, on the decoding side; the encoding side converts subclasses to their base."""
    value = {(1, "a"): [1.5, float("inf"), None, True, b"\x00", 2j, frozenset({3})]}
    assert loads(dumps(value)) == value and type(loads(dumps((1,)))) is tuple
    assert type(loads(dumps(type("Int", (int,), {"__eq__": lambda s, o: True})(3)))) is int
    for bad in (object(), [print], {"k": type("Yes", (), {})()}):
        with pytest.raises(CannotCross):
            dumps(bad)
    for bad in ('{"$tuple": 1}', '{"a": 1}', "NaN", '{"$set": [[1]]}', '{"$tuple": [], "$set": []}'):
        with pytest.raises(CannotCross):
            loads(bad)


@needs_bwrap
def test_an_untrusted_verdict_is_never_a_pass():
    """A checker that dies or reports garbage (here made so by the row's own tests) has no verdict:
    SandboxLimitError, which reward_on_error scores 0 or raises on."""
    dies = ["assert add(1, 2) == 3", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"]
    garbage = ["import os\nfor fd in range(3, 10):\n    try:\n        os.write(fd, b'{\"passed\": [true, true, true]}\\n')\n"
               "    except OSError:\n        pass\nos._exit(0)"]
    code = "def add(a, b): return a + b"
    assert run_tests(code, dies).status == "untrusted: the checker ended with killed by SIGKILL"
    assert run_tests(code, garbage).status.startswith("untrusted: malformed report")
    reward = CodeExecutionReward(timeout=5)
    with pytest.raises(SandboxLimitError, match=r"gave a verdict that cannot be trusted \(the checker ended with killed"):
        reward(["q"], [code], tests=[dies])
    scores, failures = RewardFunctions([reward], on_error="zero")(["q"] * 2, [code] * 2, {"tests": [dies, garbage]})
    assert scores[:, 0].tolist() == [0.0, 0.0] and failures == {"code": 2}
    for out, checker in [(b'{"passed": [true]}\n{"passed": [true]}', "ok"), (b'{"passed": [1]}', "ok"),
                         (b'{"passed": [true], "x": 1}', "ok"), (b'{"passed": [true]}', "exit 1"), (b"", "ok")]:
        assert verdict(out, checker, "ok", 1).killed


def test_missing_bwrap_is_refused_naming_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    reward = CodeExecutionReward(timeout=5)
    with pytest.raises(SandboxUnavailable, match=r"apt-get install -y bubblewrap.*sandbox='local-unsafe'"):
        reward(["q"], ["def add(a, b): return a + b"], tests=[["assert add(1, 2) == 3"]])
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        run_program("print(1)")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.warns(UserWarning, match=r"sandbox='local-unsafe'\) runs completions with rlimits only.*apt-get install"):
        unsafe = CodeExecutionReward(timeout=5, sandbox="local-unsafe")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert unsafe(["q"], ["def add(a, b): return a + b"], tests=[["assert add(1, 2) == 3"]]) == [1.0]
