"""`HTTPReward` against a real HTTP server on 127.0.0.1 (a subprocess, stopped by pid): the JSON
protocol, batching, retries, and an endpoint that is down, slow, refuses, or answers wrongly;
redirects to a second server on another port (another origin), which records what reached it."""
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


@pytest.fixture(scope="module")
def other_server():
    """A second service on another port of 127.0.0.1: another origin, as another host would be."""
    with running_server() as (url, _):
        yield url


def _port(url):
    return url.rsplit(":", 1)[1]


SECRET = {"Authorization": "Bearer secret", "X-Api-Key": "key"}


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
                                              rf"{url}/length failed 2 attempt\(s\).*last: ConnectionError: .*Connection refused.*Check that it is "
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


def test_an_answer_that_drips_is_cut_off_at_the_timeout(server):
    """``timeout`` bounds the whole request: a service sending a byte every 0.2 s never lets one
    read time out, yet the answer (~20 bytes, 4 s) is abandoned after about a second."""
    reward = HTTPReward(server + "/drip", timeout=1.0, retries=0)
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"/drip failed 1 attempt\(s\).*the answer took more than 1 s"):
        RewardFunctions([reward])(PROMPTS[:2], COMPLETIONS[:2], {})
    assert time.monotonic() - start < 2.5


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
    # an int no float holds, JSON past the recursion limit, an answer over the 4 MiB default cap:
    # one RewardError for the batch naming the endpoint (not OverflowError/RecursionError retried per sample)
    ("/huge_int", r"/huge_int returned 1000000000000000000000000000000000000000\.\.\. \(401 characters\) for completion "
                  "0 of 3: rewards must be finite numbers"),
    ("/long_int", r"/long_int answered a number Python refuses to read \(Exceeds the limit \(4300 digits\).*'\{\"rewards\": \[999"),
    ("/deep", r"/deep answered JSON nested too deeply to read .*'\{\"rewards\": \[\[\[\["),
    ("/oversize", r"/oversize answered more than 4194304 bytes \(Content-Length 50000\d\d\); .*raise max_response_bytes"),
])
@pytest.mark.parametrize("on_error", ["raise", "zero"])
def test_wrong_answers_are_errors_even_under_zero(server, path, message, on_error):
    before = len(fetch_log(server))
    reward = HTTPReward(server + path, retries=3, backoff=0.05)
    with pytest.raises(RewardError, match=message):
        RewardFunctions([reward], on_error=on_error)(PROMPTS[:3], COMPLETIONS[:3], {})
    assert len(_new_entries(server, before)) == 1  # a protocol error is not retried


def test_an_endless_answer_is_cut_at_the_cap(server):
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"/endless answered more than 4194304 bytes \(Content-Length 10{12}\)"):
        RewardFunctions([HTTPReward(server + "/endless")], timeout=15)(PROMPTS[:2], COMPLETIONS[:2], {})
    assert time.monotonic() - start < 10  # read 4 MiB and hung up, never the announced terabyte


def test_a_cap_above_the_answer_reads_it(server):
    reward = HTTPReward(server + "/oversize", max_response_bytes=6_000_000)
    assert RewardFunctions([reward])(PROMPTS[:3], COMPLETIONS[:3], {})[0][:, 0].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(RewardError, match=r"/length answered more than 20 bytes"):  # '{"rewards": [1.0]}' is 18 bytes
        RewardFunctions([HTTPReward(server + "/length", max_response_bytes=20)])(PROMPTS[:2], COMPLETIONS[:2], {})


@pytest.mark.parametrize("status, follow", [(s, False) for s in (301, 302, 303, 307, 308)]
                         + [(s, True) for s in (301, 302, 303)])
def test_a_redirect_is_refused_and_its_target_gets_nothing(server, other_server, status, follow):
    """A client that followed it would re-send the POST to the other origin (urllib's default: as a
    GET with the Authorization header) and take that host's rewards (100.0 each). Refused by default; with follow_redirects,
    the statuses that turn the POST into a GET stay refused (307/308: the next test)."""
    before, before_other = len(fetch_log(server)), len(fetch_log(other_server))
    reward = HTTPReward(f"{server}/redirect/{status}/{_port(other_server)}/stolen?n=3", headers=SECRET,
                        follow_redirects=follow, retries=2)
    message = "turns the POST into a GET without the batch" if follow else \
        "redirects are not followed .*follow_redirects=True"
    with pytest.raises(RewardError, match=rf"{server}/redirect/{status}/\d+/stolen\?n=3 answered HTTP {status}, a "
                                          rf"redirect to 'http://127.0.0.1:\d+/stolen\?n=3'.*{message}"):
        RewardFunctions([reward], on_error="zero")(PROMPTS[:3], COMPLETIONS[:3], {})
    assert len(_new_entries(server, before)) == 1  # not retried
    assert _new_entries(other_server, before_other) == []


@pytest.mark.parametrize("status", [307, 308])
def test_a_followed_redirect_to_another_origin_carries_no_header(server, other_server, status):
    before, before_other = len(fetch_log(server)), len(fetch_log(other_server))
    reward = HTTPReward(f"{server}/redirect/{status}/{_port(other_server)}/length", headers=SECRET,
                        follow_redirects=True)
    scores, _ = RewardFunctions([reward])(PROMPTS[:3], COMPLETIONS[:3], {})
    assert scores[:, 0].tolist() == [1.0, 2.0, 3.0]  # the batch was re-posted and scored there
    first, = _new_entries(server, before)
    assert first["headers"]["authorization"] == "Bearer secret" and first["headers"]["x-api-key"] == "key"
    there, = _new_entries(other_server, before_other)
    assert (there["method"], there["path"], there["completions"]) == ("POST", "/length", COMPLETIONS[:3])
    assert "authorization" not in there["headers"] and "x-api-key" not in there["headers"]


def test_a_followed_redirect_within_the_origin_keeps_the_headers(server):
    before = len(fetch_log(server))
    reward = HTTPReward(f"{server}/redirect/307/{_port(server)}/length", headers=SECRET, follow_redirects=True)
    RewardFunctions([reward])(PROMPTS[:2], COMPLETIONS[:2], {})
    hop, final = _new_entries(server, before)
    assert final["path"] == "/length" and final["headers"]["authorization"] == "Bearer secret"


def test_a_redirect_chain_longer_than_five_is_refused(server):
    before = len(fetch_log(server))
    reward = HTTPReward(server + f"/redirect/307/{_port(server)}" * 6 + "/length", follow_redirects=True)
    with pytest.raises(RewardError, match=r"redirected more than 5 times"):
        RewardFunctions([reward])(PROMPTS[:2], COMPLETIONS[:2], {})
    assert len(_new_entries(server, before)) == 6


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
    with pytest.raises(ValueError, match=r"max_response_bytes must be an int >= 1 \(got 0\)"):
        HTTPReward("http://127.0.0.1:1/", max_response_bytes=0)


def test_a_body_cut_short_is_a_connection_error_retried(server):
    """Issue 37: the connection dropped mid-answer (fewer bytes than Content-Length) was read as
    "answered invalid JSON", not retried, and stopped the run even under reward_on_error="zero"."""
    before = len(fetch_log(server))
    reward = HTTPReward(server + "/short_once", retries=2, backoff=0.05)
    scores, _ = RewardFunctions([reward])(PROMPTS[:2], COMPLETIONS[:2], {})
    assert scores[:, 0].tolist() == [1.0, 2.0]  # the second attempt's full answer
    assert [e["path"] for e in _new_entries(server, before)] == ["/short_once"] * 2


def test_a_body_always_cut_short_fails_as_unavailable_then_zero(server):
    reward = HTTPReward(server + "/short", retries=1, backoff=0.05)
    with pytest.raises(RewardError, match=r"/short failed 2 attempt\(s\).*last: IncompleteRead.*Check that it is running"):
        RewardFunctions([reward])(PROMPTS[:3], COMPLETIONS[:3], {})
    with pytest.warns(UserWarning, match=r"all 3 scored 0 and counted in rewards/http/failures"):
        scores, failures = RewardFunctions([reward, const], on_error="zero")(PROMPTS[:3], COMPLETIONS[:3], {})
    assert scores.tolist() == [[0.0, 1.0]] * 3 and failures == {"http": 3, "const": 0}
