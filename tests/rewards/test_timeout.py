"""``reward_timeout``: a reward that hangs (sync, async, or an async one that blocks its loop) is
handled per ``reward_on_error`` and counted, never a hang."""
import asyncio
import threading
import time

import pytest

from lightning_rlpt.rewards import RewardError, RewardFunctions

PROMPTS = ["1+1=", "2+2=", "3+3="]
COMPLETIONS = ["2", "4", "7"]


@pytest.fixture
def release():
    """An event the hanging functions wait on; set at the end so abandoned threads finish."""
    event = threading.Event()
    yield event
    event.set()


def const(prompts, completions, **_):
    return [1.0] * len(completions)


def _hangs(release):
    def hang(prompts, completions, **_):
        release.wait(60)
        return [0.5] * len(completions)
    return hang


def test_sync_hang_raises_naming_function_and_timeout(release):
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"reward function 'hang' failed on a batch of 3 completions: gave no result "
                                          r"within reward_timeout=0.3 s .*abandoned.*Raise reward_timeout or make the "
                                          r"function faster, or pass reward_on_error='zero'.*rewards/hang/failures"):
        RewardFunctions([const, _hangs(release)], timeout=0.3)(PROMPTS, COMPLETIONS, {})
    assert time.monotonic() - start < 2.0


def test_sync_hang_scored_zero_and_counted(release):
    with pytest.warns(UserWarning, match="'hang' failed on a batch of 3.*all 3 scored 0"):
        scores, failures = RewardFunctions([const, _hangs(release)], on_error="zero", timeout=0.3)(PROMPTS, COMPLETIONS, {})
    assert scores.tolist() == [[1.0, 0.0]] * 3
    assert failures == {"const": 0, "hang": 3}


def test_async_hang_is_cancelled(release):
    cancelled = threading.Event()

    async def sleepy(prompts, completions, **_):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return [1.0] * len(completions)

    with pytest.warns(UserWarning, match="all 3 scored 0"):
        scores, failures = RewardFunctions([const, sleepy], on_error="zero", timeout=0.3)(PROMPTS, COMPLETIONS, {})
    assert failures["sleepy"] == 3 and scores[:, 1].tolist() == [0.0] * 3
    assert cancelled.wait(5)  # the coroutine was cancelled, not left running


def test_async_that_blocks_its_loop_still_times_out(release):
    async def blocking(prompts, completions, **_):
        release.wait(60)  # sync wait inside async def: the loop cannot cancel it
        return [1.0] * len(completions)

    start = time.monotonic()
    with pytest.raises(RewardError, match="'blocking' failed on a batch of 3 completions: gave no result within "
                                          "reward_timeout=0.3 s"):
        RewardFunctions([blocking], timeout=0.3)(PROMPTS, COMPLETIONS, {})
    assert time.monotonic() - start < 2.0


def test_sample_that_hangs_after_the_batch_raised_is_named(release):
    def picky(prompts, completions, **_):
        if len(completions) > 1:
            raise ValueError("batch too big")
        if completions[0] == "4":
            release.wait(60)
        return [1.0]

    with pytest.raises(RewardError, match=r"'picky' raised RewardTimeout: gave no result within reward_timeout=0.3 s.* "
                                          r"on sample 1 \(prompt '2\+2=', completion '4'\)"):
        RewardFunctions([picky], timeout=0.3)(PROMPTS, COMPLETIONS, {})
    scores, failures = RewardFunctions([picky], on_error="zero", timeout=0.3)(PROMPTS, COMPLETIONS, {})
    assert scores[:, 0].tolist() == [1.0, 0.0, 1.0] and failures == {"picky": 1}


def test_without_a_timeout_sync_rewards_run_in_the_callers_thread():
    seen = []

    def where(prompts, completions, **_):
        seen.append(threading.current_thread())
        return [1.0] * len(completions)

    RewardFunctions([where])(PROMPTS, COMPLETIONS, {})
    RewardFunctions([where], timeout=5)(PROMPTS, COMPLETIONS, {})
    assert seen[0] is threading.current_thread() and seen[1] is not threading.current_thread()
    assert seen[1].daemon


def test_a_timeout_error_raised_by_the_function_is_its_own_error():
    def raises_timeout(prompts, completions, **_):
        raise TimeoutError("database timed out")

    with pytest.raises(RewardError, match="'raises_timeout' raised TimeoutError: database timed out on sample 0"):
        RewardFunctions([raises_timeout], timeout=5)(PROMPTS, COMPLETIONS, {})


@pytest.mark.parametrize("bad", [0, -1.0])
def test_bad_timeout(bad):
    with pytest.raises(ValueError, match=r"reward_timeout must be > 0 seconds, or None for no limit"):
        RewardFunctions([const], timeout=bad)
