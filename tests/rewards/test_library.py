"""The reward library: math answers checked by math_verify, regex format rewards, Kimi k1.5's length
penalty. (DAPO's overlong punishment: test_overlong.py; the code reward: test_code_reward.py.)"""
import doctest
import pickle
import re
import threading

import pytest

import lightning_rlpt
from lightning_rlpt.rewards import format, length, library, math_answer, text
from lightning_rlpt.rewards.code import reward as code, sandbox
from lightning_rlpt.rewards.library import (FormatReward, LengthPenalty, MathAnswerReward, completion_text,
                                           format_reward, math_answer_reward, think_format_reward)
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


@pytest.mark.parametrize("completion, expected", [
    ("<think>\nThis is my reasoning.\n</think>\nThis is my answer.", 1.0),  # TRL's docstring examples
    ("<think>\nThis is my reasoning.\nThis is my answer.", 0.0),
    ("<think></think>", 1.0),
    ("<think>a</think>b</think>", 1.0),  # a stray closing tag later is allowed, as in TRL
    ("<think>a</think><think>b</think>", 0.0),  # a second opening tag is not
    (" <think>a</think>", 0.0),  # must start with the tag
    ("answer first <think>a</think>", 0.0),
    ([{"role": "assistant", "content": "<think>r</think>4"}], 1.0),
])
def test_think_format_reward_is_trls(completion, expected):
    assert think_format_reward(["q"], [completion]) == [expected]


def test_think_format_reward_is_logged_under_its_own_name():
    assert RewardFunctions([format_reward, think_format_reward]).names == ["format", "think_format"]
    assert RewardFunctions(["lightning_rlpt:think_format_reward"]).names == ["think_format"]
    assert FormatReward(r"\d+", name="digits").__name__ == "digits"
    assert pickle.loads(pickle.dumps(think_format_reward)).__name__ == "think_format"


def exact(prompts, completions, answer, **_):
    return [float(c == a) for c, a in zip(completions, answer)]


def test_length_penalty_by_hand():
    """Kimi k1.5: λ = 0.5 − (len − min)/(max − min) per group; λ if correct, min(0, λ) if not."""
    # group 0 (prompt a): lengths 4, 8, 12, 6 -> λ = 0.5, 0, -0.5, 0.25; the last two are wrong
    # group 1 (prompt b): lengths 5, 5 -> all equal: 0. Rows interleaved: grouping goes by index.
    rows = [("a", 0, 4, "1"), ("b", 1, 5, "1"), ("a", 0, 8, "1"), ("a", 0, 12, "x"), ("b", 1, 5, "x"), ("a", 0, 6, "x")]
    prompts, index, lengths, completions = map(list, zip(*rows))
    got = LengthPenalty(exact)(prompts, completions, answer=["1"] * 6, index=index,
                               completion_ids=[[7] * n for n in lengths])
    assert got == pytest.approx([0.5, 0.0, 0.0, -0.5, 0.0, 0.0])
    # no index column: equal prompts make a group, with the same result
    assert LengthPenalty(exact)(prompts, completions, answer=["1"] * 6, completion_ids=[[7] * n for n in lengths]) \
        == pytest.approx(got)
    # one shared index but two prompts (a mixture of two sources): still two groups
    assert LengthPenalty(exact)(prompts, completions, answer=["1"] * 6, index=[0] * 6,
                                completion_ids=[[7] * n for n in lengths]) == pytest.approx(got)


def test_length_penalty_threshold_and_names():
    def partial(prompts, completions, score, **_):
        return score
    penalty = LengthPenalty(partial, threshold=0.5)  # correct when the score is at least 0.5
    got = penalty(["p"] * 3, ["", "", ""], score=[0.5, 0.4, 1.0], completion_ids=[[1] * 10, [1] * 2, [1] * 6])
    assert got == pytest.approx([-0.5, 0.0, 0.0])  # λ = -0.5, 0.5 (wrong: min(0, 0.5)), 0.0
    rf = RewardFunctions([math_answer_reward, LengthPenalty(math_answer_reward)], weights=[1.0, 0.1])
    scores, _ = rf(["q"] * 2, [r"\boxed{2}", r"so \boxed{2}"], {"answer": ["2", "2"]}, completion_ids=[[1] * 3, [1] * 9])
    assert rf.names == ["math_answer", "length"] and scores.tolist() == [[1.0, 0.5], [1.0, -0.5]]
    assert pickle.loads(pickle.dumps(LengthPenalty(math_answer_reward))).threshold == 1.0
    with pytest.raises(TypeError, match="correctness must be a reward function.*math_answer_reward"):
        LengthPenalty("math_answer")


def test_every_import_path_still_works():
    for name in ("math_answer_reward", "format_reward", "think_format_reward", "soft_overlong_punishment",
                 "FormatReward", "MathAnswerReward", "SoftOverlongPunishment", "LengthPenalty", "CodeExecutionReward"):
        assert getattr(lightning_rlpt, name) is getattr(library, name)
    assert library.completion_text is text.completion_text and library.THINK_ANSWER_FORMAT == format.THINK_ANSWER_FORMAT


@pytest.mark.parametrize("module", [code, format, length, library, math_answer, sandbox, text])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0
