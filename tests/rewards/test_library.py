"""The reward library: math answers checked by math_verify, and a regex format reward."""
import doctest
import pickle
import re
import threading

import pytest

from lightning_rlpt.rewards import library as reward_library
from lightning_rlpt.rewards.library import (FormatReward, MathAnswerReward, completion_text, format_reward,
                                           math_answer_reward)
from lightning_rlpt.rewards import RewardError, RewardFunctions


def score(completions, answers, reward=math_answer_reward):
    return reward(["q"] * len(completions), completions, answer=answers)


@pytest.mark.parametrize("completion, gold", [
    (r"The answer is \boxed{1/2}.", "0.5"),
    (r"\boxed{\frac{1}{2}}", "0.5"),
    ("0.5", r"$\frac{1}{2}$"),
    (r"so it is $\frac12$", r"\frac{1}{2}"),
    ("<think>3 apples plus 4 is 7, minus 2</think> <answer>5</answer>", "5"),
    ("She has 12 left.", "12"),
    (r"\boxed{12}", 12),  # a numeric column (jsonl integers) works too
])
def test_equal_answers_score_one(completion, gold):
    assert score([completion], [gold]) == [1.0]


@pytest.mark.parametrize("completion, gold", [
    (r"\boxed{1/3}", "0.5"),
    (r"\boxed{2}", r"$\frac{1}{2}$"),
    ("<think>the answer is 5</think><answer>7</answer>", "5"),  # only the <answer> block counts
    ("I do not know", "0.5"),  # nothing to parse in the completion
    ("", "0.5"),
])
def test_wrong_or_missing_answers_score_zero(completion, gold):
    assert score([completion], [gold]) == [0.0]


def test_conversational_completions():
    conv = [[{"role": "assistant", "content": r"\boxed{0.5}"}],
            [{"role": "user", "content": "half?"}, {"role": "assistant", "content": "1/3"}],
            [{"role": "assistant", "content": [{"type": "text", "text": r"\boxed{\frac{1}{2}}"}]}]]
    assert score(conv, ["1/2"] * 3) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="no assistant message"):
        completion_text([{"role": "user", "content": "hi"}])


def test_unparseable_gold_scores_zero_with_a_warning():
    with pytest.warns(UserWarning, match="cannot parse the gold answer 'no answer here'.*score 0.0"):
        assert score([r"\boxed{1}", "anything"], ["no answer here", "no answer here"]) == [0.0, 0.0]


def test_unparseable_gold_can_raise_and_be_counted():
    strict = MathAnswerReward(unparseable_gold="raise")
    with pytest.raises(RewardError, match="math_answer.*cannot parse the gold answer 'n/a'.*sample 1"):
        RewardFunctions([strict])(["q", "q"], ["1", "1"], {"answer": ["1", "n/a"]})
    scores, failures = RewardFunctions([strict], on_error="zero")(["q", "q"], ["1", "1"], {"answer": ["1", "n/a"]})
    assert scores[:, 0].tolist() == [1.0, 0.0] and failures == {"math_answer": 1}


def test_missing_gold_column_says_how_to_map_it():
    with pytest.raises(KeyError, match=r"column 'answer', but the batch has \['solution'\].*columns=\{'solution'"):
        math_answer_reward(["q"], ["1"], solution=["1"])
    assert MathAnswerReward(column="solution")(["q"], ["1"], solution=["1"]) == [1.0]


def test_works_off_the_main_thread():
    # math_verify's signal-based timeout raises outside the main thread unless it is turned off
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("scores", score([r"\boxed{1/2}", "3"], ["0.5", "4"])))
    worker.start()
    worker.join()
    assert out["scores"] == [1.0, 0.0]


@pytest.mark.parametrize("completion, expected", [
    ("<think>7 - 2 = 5</think>\n<answer>5</answer>", 1.0),
    ("  <think>\nmulti\nline\n</think>\n\n<answer>\n5\n</answer>\n", 1.0),
    ("<answer>5</answer>", 0.0),  # no reasoning block
    ("<think>x</think>", 0.0),  # no answer block
    ("<think>x</think><answer>5</answer> and more text", 0.0),  # trailing text
    ("<think>x</think><answer>5</answer><answer>6</answer>", 0.0),  # two answers
    ("<think>a<think>b</think><answer>5</answer>", 0.0),  # nested think
])
def test_default_format(completion, expected):
    assert format_reward(["q"], [completion]) == [expected]


def test_custom_format_and_bad_pattern():
    boxed = FormatReward(r".*\\boxed\{[^}]+\}\s*")
    assert boxed(["q"] * 3, [r"so \boxed{4}", "4", [{"role": "assistant", "content": r"\boxed{4}"}]]) == [1.0, 0.0, 1.0]
    assert FormatReward(re.compile(r"\d+"))(["q"], ["42"]) == [1.0]
    with pytest.raises(ValueError, match=r"not a valid regular expression"):
        FormatReward("(<think>")
    with pytest.raises(ValueError, match="unparseable_gold must be"):
        MathAnswerReward(unparseable_gold="skip")


def test_names_weights_and_pickling():
    rf = RewardFunctions([math_answer_reward, format_reward], weights=[1.0, 0.5])
    assert rf.names == ["math_answer", "format"]  # logged as rewards/math_answer/..., rewards/format/...
    good = "<think>half</think><answer>\\frac{1}{2}</answer>"
    scores, _ = rf(["q"] * 3, [good, r"\boxed{0.5}", "<think>t</think><answer>2</answer>"], {"answer": ["0.5"] * 3})
    assert scores.tolist() == [[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    assert rf.combine(scores).tolist() == [1.5, 1.0, 0.5]
    assert pickle.loads(pickle.dumps(math_answer_reward)).column == "answer"  # dataloader workers / spawn
    # configs name them by import path
    assert RewardFunctions(["lightning_rlpt.rewards.library:math_answer_reward", "lightning_rlpt:format_reward"]).names \
        == ["math_answer", "format"]


def test_docstring_examples():
    assert doctest.testmod(reward_library).failed == 0
