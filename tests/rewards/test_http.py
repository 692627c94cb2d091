"""`HTTPReward` against a real HTTP server on 127.0.0.1 (a subprocess, stopped by pid): the JSON
protocol, batching, retries, and an endpoint that is down, slow, refuses, or answers wrongly."""
import math
import time

import pytest
from reward_server import fetch_log, running_server, stop

from lightning_rlpt.rewards import HTTPReward, RewardError, RewardFunctions, TrainerState

PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4=", "5+5="]
COMPLETIONS = ["2", "44", "six", "8888", "1010"]
COLUMNS = {"task": ["math", "math", "poetry", "math", "math"], "answer": ["2", "4", "6", "8", "10"]}
IDS = [[1], [2, 2], [3, 3, 3], [4, 4, 4, 4], [5, 5, 5, 5]]


def const(prompts, completions, **_):
    return [1.0] * len(completions)


@pytest.fixture(scope="module")
def server():
    with running_server() as (url, _):
        yield url


def _new_entries(url, before):
    return fetch_log(url)[before:]


def test_scores_come_back_in_order_batched_with_columns_and_state(server):
    reward = HTTPReward(server + "/length", batch_size=2, name="remote_len")
    before = len(fetch_log(server))
    scores, failures = RewardFunctions([reward, const])(PROMPTS, COMPLETIONS, COLUMNS, completion_ids=IDS,
                                                        trainer_state=TrainerState(global_step=7, max_steps=10))
    got = scores[:, 0].tolist()
    assert got[:2] == [1.0, 2.0] and math.isnan(got[2]) and got[3:] == [4.0, 4.0]  # null for the poetry sample
    assert failures == {"remote_len": 0, "const": 0}
    log = _new_entries(server, before)
    assert sorted(e["n"] for e in log) == [1, 2, 2]  # 5 completions in batches of at most 2
    assert sorted(c for e in log for c in e["completions"]) == sorted(COMPLETIONS)
    assert all(e["keys"] == ["answer", "completion_ids", "completions", "prompts", "task", "trainer_state"] for e in log)
    assert log[0]["trainer_state"] == {"global_step": 7, "epoch": 0.0, "max_steps": 10, "num_train_epochs": None}


def test_columns_selects_what_is_sent(server):
    before = len(fetch_log(server))
    reward = HTTPReward(server + "/length", columns=["task"])
    RewardFunctions([reward, const])(PROMPTS, COMPLETIONS, COLUMNS, completion_ids=IDS)
    assert _new_entries(server, before)[0]["keys"] == ["completion_ids", "completions", "prompts", "task"]


def test_a_503_is_retried_with_backoff(server):
    before = len(fetch_log(server))
    reward = HTTPReward(server + "/flaky", retries=2, backoff=0.05)
    scores, _ = RewardFunctions([reward])(PROMPTS[:2], COMPLETIONS[:2], {})
    assert scores[:, 0].tolist() == [1.0, 2.0]
    assert [e["path"] for e in _new_entries(server, before)] == ["/flaky"] * 3  # two 503s, then the answer


def test_endpoint_down_raises_naming_the_url_or_scores_zero():
    with running_server() as (url, proc):
        stop(proc)  # the service dies: nothing listens on the port any more
        assert proc.poll() is not None
        reward = HTTPReward(url + "/length", retries=1, backoff=0.05, timeout=2)
        with pytest.raises(RewardError, match=rf"'http' failed on a batch of 3 completions: reward service "
                                              rf"{url}/length failed 2 attempt\(s\).*Connection.*Refused.*Check that it is "
                                              r"running.*reward_on_error='zero'"):
            RewardFunctions([reward, const])(PROMPTS[:3], COMPLETIONS[:3], {})
        with pytest.warns(UserWarning, match=r"all 3 scored 0 and counted in rewards/http/failures"):
            scores, failures = RewardFunctions([reward, const], on_error="zero")(PROMPTS[:3], COMPLETIONS[:3], {})
        assert scores.tolist() == [[0.0, 1.0]] * 3 and failures == {"http": 3, "const": 0}


def test_slow_endpoint_times_out_per_request(server):
    reward = HTTPReward(server + "/slow", timeout=0.3, retries=1, backoff=0.0)
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"/slow failed 2 attempt\(s\) \(timeout 0.3 s each\); last: .*timed out"):
        RewardFunctions([reward])(PROMPTS[:2], COMPLETIONS[:2], {})
    assert time.monotonic() - start < 2.5  # the server sleeps 3 s per request: nobody waited for it


def test_slow_endpoint_stopped_by_reward_timeout(server):
    reward = HTTPReward(server + "/slow", timeout=30, retries=0)
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'http' failed on a batch of 2 completions: gave no result within "
                                          r"reward_timeout=0.5 s.*Raise reward_timeout or make the function faster"):
        RewardFunctions([reward], timeout=0.5)(PROMPTS[:2], COMPLETIONS[:2], {})
    assert time.monotonic() - start < 2.5


@pytest.mark.parametrize("path, message", [
    ("/wrong_count", r"/wrong_count returned 2 rewards for 3 completions: '\{\"rewards\": \[1.0, 2.0\]\}'.*one reward per "
                     "completion"),
    ("/not_numbers", r"/not_numbers returned 'high' for completion 0 of 3: rewards must be finite numbers, or null"),
    ("/bad_json", r"/bad_json answered invalid JSON .*'<html>oops</html>'.*it must answer \{\"rewards\""),
    ("/refuse", r"/refuse answered HTTP 400: .*no such task.*retrying would not help"),
])
@pytest.mark.parametrize("on_error", ["raise", "zero"])
def test_wrong_answers_are_errors_even_under_zero(server, path, message, on_error):
    before = len(fetch_log(server))
    reward = HTTPReward(server + path, retries=3, backoff=0.05)
    with pytest.raises(RewardError, match=message):
        RewardFunctions([reward], on_error=on_error)(PROMPTS[:3], COMPLETIONS[:3], {})
    assert len(_new_entries(server, before)) == 1  # a protocol error is not retried


def test_column_that_is_not_json_is_refused_before_any_request(server):
    before = len(fetch_log(server))
    with pytest.raises(RewardError, match=r"field 'blob' cannot be sent as JSON.*HTTPReward\(columns=\[...\]\)"):
        RewardFunctions([HTTPReward(server + "/length")])(PROMPTS[:1], COMPLETIONS[:1], {"blob": [object()]})
    assert len(fetch_log(server)) == before


def test_construction_errors():
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        HTTPReward("127.0.0.1:8000/score")
    with pytest.raises(ValueError, match="timeout > 0"):
        HTTPReward("http://127.0.0.1:1/", timeout=0)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        HTTPReward("http://127.0.0.1:1/", batch_size=0)
