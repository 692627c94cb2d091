"""Reward functions: weights, names, and every way a reward function can go wrong."""
import math

import pytest

from lightning_rlpt.rewards import RewardError, RewardFunctions

PROMPTS = ["1+1=", "2+2=", "3+3="]
COMPLETIONS = ["2", "5", "6"]
COLUMNS = {"answer": ["2", "4", "6"]}


def exact(prompts, completions, answer, **_):
    return [float(c == a) for c, a in zip(completions, answer)]


def length(prompts, completions, **_):
    return [len(c) for c in completions]


def test_weighted_sum_and_names():
    rf = RewardFunctions([exact, length], weights=[2.0, 0.5])
    scores, failures = rf(PROMPTS, COMPLETIONS, COLUMNS)
    assert scores.tolist() == [[1, 1], [0, 1], [1, 1]]
    assert rf.combine(scores).tolist() == [2.5, 0.5, 2.5]
    assert rf.names == ["exact", "length"] and failures == {"exact": 0, "length": 0}


def test_duplicate_names_get_suffixes():
    assert RewardFunctions([exact, exact]).names == ["exact", "exact_1"]


def breaks_on_five(prompts, completions, **_):
    return [1.0 / (c != "5") for c in completions]


def test_raising_function_names_itself_and_the_sample():
    with pytest.raises(RewardError, match=r"'breaks_on_five' raised ZeroDivisionError.*sample 1 .*'2\+2='.*'5'"):
        RewardFunctions([breaks_on_five])(PROMPTS, COMPLETIONS, COLUMNS)


def test_raising_function_scored_zero_and_counted():
    scores, failures = RewardFunctions([breaks_on_five], on_error="zero")(PROMPTS, COMPLETIONS, COLUMNS)
    assert scores[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert failures == {"breaks_on_five": 1}


def test_wrong_number_of_values():
    with pytest.raises(RewardError, match="returned 2 values for 3 completions"):
        RewardFunctions([lambda prompts, completions, **_: [1.0, 0.0]])(PROMPTS, COMPLETIONS, COLUMNS)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values(bad):  # None is "does not apply" (tests/rewards/test_trl_semantics.py); NaN is a bug
    def fn(prompts, completions, **_):
        return [1.0, bad, 0.0]

    with pytest.raises(RewardError, match="non-finite value .* for sample 1.*or None where the reward does not apply"):
        RewardFunctions([fn])(PROMPTS, COMPLETIONS, COLUMNS)


def test_not_numbers():
    with pytest.raises(RewardError, match="must return a list of numbers"):
        RewardFunctions([lambda prompts, completions, **_: ["a", "b", "c"]])(PROMPTS, COMPLETIONS, COLUMNS)


def test_construction_errors():
    with pytest.raises(ValueError, match="reward_funcs is empty"):
        RewardFunctions([])
    with pytest.raises(ValueError, match="not an import path"):
        RewardFunctions([exact, "length"])
    with pytest.raises(ImportError, match="has no reward function 'nope'"):
        RewardFunctions([exact, "operator:nope"])
    with pytest.raises(TypeError, match="not callable"):
        RewardFunctions([exact, 3])
    with pytest.raises(ValueError, match="one weight per function"):
        RewardFunctions([exact], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="on_error"):
        RewardFunctions([exact], on_error="ignore")


@pytest.mark.parametrize("name", ["functions", "resolve", "calling", "state", "http"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"lightning_rlpt.rewards.{name}"))
    assert result.failed == 0 and result.attempted > 0
