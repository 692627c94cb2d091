"""Environment protocol: wrong return types of reset/step raise TypeError naming the method and
the wrong value; factories make a fresh environment; EnvironmentReward reads env_reward."""
from __future__ import annotations

import numpy as np
import pytest

from lightning_rlpt.rollout.episodes.environment import (Environment, EnvironmentReward, check_reset, check_step,
                                                          make_environment)


class GuessNumber:
    """Three tries to guess the row's target; +1 when right, -0.1 per wrong try."""

    def reset(self, row):
        self.target, self.tries = row["target"], 0
        return "Guess a number from 1 to 9."

    def step(self, text):
        self.tries += 1
        if text.strip() == str(self.target):
            return None, 1.0, True
        return ("Higher." if int(text) < self.target else "Lower."), -0.1, self.tries >= 3


class Broken:
    def __init__(self, reset_value=None, step_value=None):
        self.reset_value, self.step_value = reset_value, step_value

    def reset(self, row):
        return self.reset_value

    def step(self, text):
        return self.step_value


def test_a_real_episode_through_the_checks():
    env = make_environment(GuessNumber)
    assert isinstance(env, Environment)
    assert check_reset(env, env.reset({"target": 7})) == "Guess a number from 1 to 9."
    results = [check_step(env, env.step(guess)) for guess in ("3", "8", "7")]
    assert results == [("Higher.", -0.1, False), ("Lower.", -0.1, False), (None, 1.0, True)]
    assert make_environment(GuessNumber) is not env  # fresh per episode


@pytest.mark.parametrize("value, says", [
    (("obs", 1.0), "got tuple ('obs', 1.0)"),
    (None, "got NoneType None"),
    (("obs", 1.0, False, False, {}), "for a Gymnasium 5-tuple return (observation, reward, terminated or truncated)"),
    ((3, 1.0, False), "observation is int 3"),
    (("obs", "1.0", False), "reward is str '1.0'"),
    (("obs", True, False), "reward is bool True"),
    (("obs", float("nan"), False), "reward is float nan"),
    (("obs", 1.0, "yes"), "done is str 'yes'"),
    (("obs", 1.0, None), "done is NoneType None"),
    (("obs", 1.0, 0), "done is int 0"),
])
def test_wrong_step_types_name_the_method(value, says):
    env = Broken(step_value=value)
    with pytest.raises(TypeError) as info:
        check_step(env, env.step("x"))
    message = str(info.value)
    assert message.startswith("Broken.step must return (observation: str | None, reward: float | None, done: bool)")
    assert says in message


def test_step_accepts_none_numpy_and_lists():
    env = Broken()
    assert check_step(env, [None, None, True]) == (None, None, True)
    result = check_step(env, ("o", np.float32(0.5), np.bool_(False)))
    assert result == ("o", 0.5, False) and type(result[1]) is float and type(result[2]) is bool
    assert check_step(env, ("o", np.int64(2), True)) == ("o", 2.0, True)


@pytest.mark.parametrize("value, says", [(None, "got NoneType None"), (["hi"], "got list ['hi']"), (3, "got int 3")])
def test_wrong_reset_types_name_the_method(value, says):
    env = Broken(reset_value=value)
    with pytest.raises(TypeError, match=r"^Broken.reset must return a str \(the first observation, '' for none\), got ") as info:
        check_reset(env, env.reset({}))
    assert says in str(info.value)
    assert check_reset(env, "") == ""


def test_factories():
    made = []
    env = make_environment(lambda: made.append(1) or GuessNumber())
    assert isinstance(env, GuessNumber) and made == [1]
    with pytest.raises(TypeError, match="class or a zero-argument callable .* got a str instance"):
        make_environment("GuessNumber")

    class NoStep:
        def reset(self, row):
            return ""

    with pytest.raises(TypeError, match=r"factory 'NoStep' made a NoStep without step\(\).*pass its class"):
        make_environment(NoStep)
    instance_with_call = type("Weird", (), {"__call__": lambda self: 3})()
    with pytest.raises(TypeError, match=r"made a int without reset\(\) and step\(\)"):
        make_environment(instance_with_call)


def test_environment_reward():
    reward = EnvironmentReward()
    assert reward.__name__ == "env"
    assert reward(["p"] * 3, ["a", "b", "c"], env_reward=[1.0, None, -0.2], answer=[1, 2, 3]) == [1.0, 0.0, -0.2]
    with pytest.raises(KeyError, match=r"reads column 'env_reward', which the episode loop writes only when "
                                       r"RLModule\(environment=...\) is set; the batch has \['answer'\]"):
        reward(["p"], ["a"], answer=[1])
    with pytest.raises(ValueError, match="has 1 values for 2 completions"):
        reward(["p"] * 2, ["a", "b"], env_reward=[1.0])
    assert EnvironmentReward("score")(["p"], ["a"], score=[2]) == [2.0]
