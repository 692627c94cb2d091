"""``async def`` reward functions: run concurrently with each other and with the sync ones, get
the same arguments, and fail the way sync ones do."""
import asyncio
import functools
import threading

import pytest

from lightning_rlpt.rewards import RewardError, RewardFunctions
from lightning_rlpt.rewards.resolve import is_async

PROMPTS = ["1+1=", "2+2=", "3+3="]
COMPLETIONS = ["2", "5", "6"]
COLUMNS = {"answer": ["2", "4", "6"]}


def _meets(barrier):
    """Async rewards that each wait at ``barrier``: they finish only if all run at the same time."""
    async def first(prompts, completions, **_):
        await asyncio.to_thread(barrier.wait, 10)
        return [1.0] * len(completions)

    async def second(prompts, completions, answer, **_):
        await asyncio.to_thread(barrier.wait, 10)
        return [float(c == a) for c, a in zip(completions, answer)]
    return first, second


def test_async_rewards_run_concurrently_with_each_other_and_the_sync_ones():
    barrier = threading.Barrier(3)
    first, second = _meets(barrier)

    def sync(prompts, completions, **_):  # runs while the two async ones wait at the barrier
        barrier.wait(10)
        return [2.0] * len(completions)

    scores, failures = RewardFunctions([first, sync, second], weights=[1.0, 1.0, 2.0])(PROMPTS, COMPLETIONS, COLUMNS)
    assert scores.tolist() == [[1.0, 2.0, 1.0], [1.0, 2.0, 0.0], [1.0, 2.0, 1.0]]
    assert failures == {"first": 0, "sync": 0, "second": 0}
    assert not barrier.broken  # sequential calls would have broken it after 10 s


def test_async_rewards_get_the_same_arguments_as_sync_ones():
    seen = {}

    def sync(prompts, completions, **kwargs):
        seen["sync"] = (prompts, completions, kwargs)
        return [0.0] * len(completions)

    async def coro(prompts, completions, **kwargs):
        seen["async"] = (prompts, completions, kwargs)
        return [0.0] * len(completions)

    RewardFunctions([sync, coro])(PROMPTS, COMPLETIONS, COLUMNS, completion_ids=[[1], [2], [3]], trainer_state="s")
    assert seen["sync"] == seen["async"] == (PROMPTS, COMPLETIONS, {**COLUMNS, "completion_ids": [[1], [2], [3]],
                                                                    "trainer_state": "s"})


async def breaks_on_five(prompts, completions, **_):
    await asyncio.sleep(0)
    return [1.0 / (c != "5") for c in completions]


def test_async_reward_that_raises_names_the_sample():
    with pytest.raises(RewardError, match=r"'breaks_on_five' raised ZeroDivisionError.*sample 1 .*'2\+2='.*'5'"):
        RewardFunctions([breaks_on_five])(PROMPTS, COMPLETIONS, COLUMNS)


def test_async_reward_that_raises_scored_zero_and_counted():
    scores, failures = RewardFunctions([breaks_on_five], on_error="zero")(PROMPTS, COMPLETIONS, COLUMNS)
    assert scores[:, 0].tolist() == [1.0, 0.0, 1.0] and failures == {"breaks_on_five": 1}


def test_async_reward_with_the_wrong_count():
    async def short(prompts, completions, **_):
        return [1.0]

    with pytest.raises(RewardError, match="'short' returned 1 values for 3 completions"):
        RewardFunctions([short], on_error="zero")(PROMPTS, COMPLETIONS, COLUMNS)


def test_scoring_from_inside_a_running_event_loop():
    """As in Jupyter, where the caller's thread already runs a loop and asyncio.run would refuse."""
    async def notebook_cell():
        return RewardFunctions([breaks_on_five], on_error="zero")(PROMPTS, COMPLETIONS, COLUMNS)

    scores, failures = asyncio.run(notebook_cell())
    assert scores[:, 0].tolist() == [1.0, 0.0, 1.0] and failures == {"breaks_on_five": 1}


class AsyncCallable:
    __name__ = "obj"

    async def __call__(self, prompts, completions, **_):
        return [3.0] * len(completions)


def test_async_forms_are_recognised():
    async def scaled(prompts, completions, scale, **_):
        return [scale] * len(completions)

    part = functools.partial(scaled, scale=4.0)
    assert is_async(part) and is_async(AsyncCallable()) and not is_async(lambda **_: [])
    scores, _ = RewardFunctions([part, AsyncCallable()])(PROMPTS, COMPLETIONS, {})
    assert scores.tolist() == [[4.0, 3.0]] * 3
