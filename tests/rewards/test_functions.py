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



def counted(value):
    """A reward function returning ``value`` (made fresh per call) and counting its calls."""
    def fn(prompts, completions, **_):
        fn.calls += 1
        return value() if callable(value) else value

    fn.calls = 0
    return fn


@pytest.mark.parametrize("on_error", ["raise", "zero"])
@pytest.mark.parametrize("value, what", [
    ({"2": 1.0, "5": 0.0, "6": 1.0}, r"a dict \(its keys would become the scores\)"),  # keys would be the scores
    ({3.0, 1.0, 2.0}, r"a set \(whose order is not the completions'\)"),  # reordered
    (lambda: (x for x in [1.0, 0.0, 1.0]), "a generator"),
    (1.0, "a float"),
])
def test_unordered_or_non_sequence_returns_are_refused(value, what, on_error):
    fn = counted(value)
    with pytest.raises(RewardError, match=rf"'fn' must return a list of numbers .* it returned {what}.*Return a list"):
        RewardFunctions([fn], on_error=on_error)(PROMPTS, COMPLETIONS, COLUMNS)
    assert fn.calls == 1  # refused once for the batch, not retried sample by sample


@pytest.mark.parametrize("on_error", ["raise", "zero"])  # a bug in the function: never a sample scored 0
@pytest.mark.parametrize("huge", [10**400, 10**5000], ids=["1e400", "1e5000"])  # 10**5000 is past Python's int-to-str limit too
def test_a_number_too_large_for_a_float_is_one_reward_error(huge, on_error):
    fn = counted([1.0, huge, 0.0])
    with pytest.raises(RewardError, match=r"'fn' returned a number too large for a float \(an integer of about "
                                          r"\d+ digits\) for sample 1; return finite floats"):
        RewardFunctions([fn], on_error=on_error)(PROMPTS, COMPLETIONS, COLUMNS)
    assert fn.calls == 1


def test_unusable_value_on_a_retried_sample_is_not_scored_zero():
    def fn(prompts, completions, **_):  # raises on the batch; alone, sample 2 returns NaN
        if len(completions) > 1:
            raise ValueError("batch")
        return [math.nan if completions[0] == "6" else 1.0]

    with pytest.raises(RewardError, match="non-finite value .* for sample 2"):
        RewardFunctions([fn], on_error="zero")(PROMPTS, COMPLETIONS, COLUMNS)


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
