"""TRL's reward-function semantics: reward functions written exactly as TRL's GRPOTrainer
documentation writes them ("Using a custom reward function") run unchanged; completions are
messages for conversational prompts; None means "does not apply"."""
import asyncio
import math
import re

import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt.rewards import RewardError, RewardFunctions, TrainerState, as_trl_completions
from lightning_rlpt.rollout import RolloutOutput, SamplingConfig
from lightning_rlpt.rewards import score_experience
from lightning_rlpt.rollout.collect import rollout_metrics, to_experience


# ---------------------------------------------------------------- TRL's documented examples, verbatim
def reward_func(completion_ids, **kwargs):  # Example 1
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completion_ids]


def reward_chars(completions, **kwargs):  # Example 1.1
    """Reward function that assigns higher scores to longer completions (in terms of character count)."""
    return [float(len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):  # Example 2
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def boxed_reward(completions, ground_truth, **kwargs):  # Example 3
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def check_math_solution(prompt, completion):
    return completion == str(eval(prompt.removeprefix("What is ").removesuffix("?")))


def test_code_solution(prompt, completion):  # the docs' helper name; not a test
    return "return" in completion


test_code_solution.__test__ = False


def math_reward_func(prompts, completions, task, **kwargs):  # Example 4
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "math":
            # Calculate math-specific reward
            correct = check_math_solution(prompt, completion)
            reward = 1.0 if correct else -1.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards


def coding_reward_func(prompts, completions, task, **kwargs):  # Example 4
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "coding":
            # Calculate coding-specific reward
            works = test_code_solution(prompt, completion)
            reward = 1.0 if works else -1.0
            rewards.append(reward)
        else:
            # Return None for non-coding tasks
            rewards.append(None)
    return rewards


async def async_reward_func(prompts, completions, **kwargs):  # Example 5
    # Simulate an I/O-bound call (e.g., HTTP request, database lookup)
    await asyncio.sleep(0.01)
    # Simple toy reward: 1.0 if the completion is non-empty, else 0.0
    return [1.0 if completion else 0.0 for completion in completions]


def logging_reward(completions, ground_truth, log_extra=None, log_metric=None, **kwargs):  # Example 6
    extracted = [re.search(r"\\boxed\{(.*?)\}", c) for c in completions]
    extracted = [m.group(1) if m else None for m in extracted]
    rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, ground_truth)]

    if log_extra:
        log_extra("golden_answer", list(ground_truth))
        log_extra("extracted_answer", [e or "[none]" for e in extracted])

    if log_metric:
        log_metric("accuracy", sum(rewards) / len(rewards))

    return rewards


# ---------------------------------------------------------------- the docs' own inputs and outputs
def test_docs_examples_give_the_documented_values():
    prompts = ["The sky is", "The sun is"]
    completions = [" blue.", " in the sky."]
    ids = [[6303, 13], [304, 279, 12884, 13]]
    scores, _ = RewardFunctions([reward_func, reward_chars, async_reward_func])(prompts, completions, {},
                                                                                completion_ids=ids)
    assert scores.tolist() == [[2.0, 6.0, 1.0], [4.0, 12.0, 1.0]]

    prompts = ["Problem: Solve the equation $2x + 3 = 7$. Solution:", "Problem: Solve the equation $3x - 5 = 10$."]
    completions = [r" The solution is \boxed{2}.", r" The solution is \boxed{6}."]
    scores, _ = RewardFunctions([boxed_reward, logging_reward])(prompts, completions, {"ground_truth": ["2", "5"]},
                                                                completion_ids=[[1], [2]], trainer_state=TrainerState())
    assert scores.tolist() == [[1.0, 1.0], [0.0, 0.0]]


def test_conversational_completions_reach_rewards_as_messages():
    prompts = [[{"role": "user", "content": "What is the result of (1 + 2) * 4?"}],
               [{"role": "user", "content": "What is the result of (3 + 1) * 2?"}]]
    texts = ["<think>The sum of 1 and 2 is 3, which we multiply by 4 to get 12.</think><answer>(1 + 2) * 4 = 12</answer>",
             "The sum of 3 and 1 is 4, which we multiply by 2 to get 8. So (3 + 1) * 2 = 8."]
    completions = as_trl_completions(prompts, texts)
    assert completions[1] == [{"role": "assistant", "content": texts[1]}]
    assert as_trl_completions(["a string prompt"], ["x"]) == ["x"]
    scores, _ = RewardFunctions([format_reward_func])(prompts, completions, {})
    assert scores[:, 0].tolist() == [1.0, 0.0]


def _experience(prompts, texts, columns):
    """A real Experience from the tests' tokenizer: completions end with EOS."""
    tok = task.build_tokenizer()
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [task.EOS_ID] for t in texts]
    batch = {"prompt": prompts, **columns}
    return to_experience(RolloutOutput(ids), [[task.BOS_ID]] * len(texts), tok, batch, 1, SamplingConfig(),
                         torch.device("cpu")), ids


def test_score_passes_messages_ids_state_and_columns():
    seen = {}

    def records(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
        seen.update(completions=completions, ids=completion_ids, state=trainer_state, answer=answer, rest=kwargs)
        return [float(len(c[0]["content"])) for c in completions]

    chat = [[{"role": "user", "content": "1+2="}], [{"role": "user", "content": "3+4="}]]
    exp, ids = _experience(chat, ["3", "17"], {"answer": ["3", "7"], "index": [0, 1]})
    state = TrainerState(global_step=4, epoch=1.0, max_steps=9)
    score_experience(exp, RewardFunctions([records]), state)
    assert seen["completions"] == [[{"role": "assistant", "content": "3"}], [{"role": "assistant", "content": "17"}]]
    assert seen["ids"] == ids == [[6, 2], [4, 10, 2]]  # '3' '</s>' ; '1' '7' '</s>'
    assert seen["state"] is state and seen["answer"] == ["3", "7"] and seen["rest"] == {"index": [0, 1]}
    assert exp.scores.tolist() == [1.0, 2.0]

    exp, _ = _experience(["1+2=", "3+4="], ["3", "17"], {"answer": ["3", "7"]})
    score_experience(exp, RewardFunctions([lambda completions, **_: [float(c == "3") for c in completions]]))
    assert exp.scores.tolist() == [1.0, 0.0]  # string prompts: string completions


# ---------------------------------------------------------------- None: "does not apply"
MIXED = {"prompts": ["What is 2+2?", "Write a function that returns the sum of two numbers.", "What is 3*4?",
                     "Write a function that returns the product of two numbers."],
         "completions": ["4", "def f(a, b): return a + b", "11", "def f(a, b): a * b"],
         "task": ["math", "coding", "math", "coding"]}


def test_multi_task_none_is_left_out_of_the_sum_and_the_per_function_metrics():
    rf = RewardFunctions([math_reward_func, coding_reward_func], weights=[2.0, 0.5])
    scores, failures = rf(MIXED["prompts"], MIXED["completions"], {"task": MIXED["task"]})
    nan = math.nan
    expected = torch.tensor([[1.0, nan], [nan, 1.0], [-1.0, nan], [nan, -1.0]])
    assert torch.equal(torch.isnan(scores), torch.isnan(expected))
    assert torch.equal(torch.nan_to_num(scores), torch.nan_to_num(expected))
    total = rf.combine(scores)
    assert total.tolist() == [2.0, 0.5, -2.0, -0.5]  # 2·1, 0.5·1, 2·(-1), 0.5·(-1): None counts for nothing
    assert failures == {"math_reward_func": 0, "coding_reward_func": 0}

    metrics = rollout_metrics(total, scores, torch.tensor([1, 25, 2, 18]), torch.zeros(4, dtype=torch.bool), 2,
                              rf.names, torch.zeros(2))
    assert metrics["rewards/math_reward_func/mean"] == 0.0  # mean of (1, -1): the None rows are skipped
    assert metrics["rewards/math_reward_func/std"] == pytest.approx(math.sqrt(2.0))  # unbiased std of (1, -1)
    assert metrics["rewards/math_reward_func/none_frac"] == 0.5
    assert metrics["rewards/coding_reward_func/none_frac"] == 0.5
    assert metrics["reward"] == 0.0 and all(math.isfinite(v) for v in metrics.values())


def test_function_that_applies_to_no_sample_logs_no_mean():
    scores = torch.tensor([[1.0, math.nan], [0.0, math.nan]])
    metrics = rollout_metrics(torch.tensor([1.0, 0.0]), scores, torch.tensor([1, 1]), torch.zeros(2, dtype=torch.bool),
                              2, ["a", "b"], torch.zeros(2))
    assert "rewards/b/mean" not in metrics and "rewards/b/std" not in metrics
    assert metrics["rewards/b/none_frac"] == 1.0 and metrics["rewards/a/none_frac"] == 0.0


def test_sample_no_function_applies_to_is_an_error_naming_it():
    rf = RewardFunctions([math_reward_func, coding_reward_func], on_error="zero")
    prompts = MIXED["prompts"] + ["Write a haiku."]
    with pytest.raises(RewardError, match=r"every reward function \(math_reward_func, coding_reward_func\) returned "
                                          r"None for sample 4 \(prompt 'Write a haiku.', completion 'Autumn'; 1 such "
                                          r"samples\).*fallback reward.*leave such prompts out"):
        rf(prompts, MIXED["completions"] + ["Autumn"], {"task": MIXED["task"] + ["poetry"]})


def test_trainer_state_from_a_lightning_trainer():
    assert TrainerState.of(None) == TrainerState(global_step=0, epoch=0.0, max_steps=-1, num_train_epochs=None)
    state = TrainerState.of(quiet_trainer(max_steps=5, max_epochs=3))
    assert state == TrainerState(global_step=0, epoch=0.0, max_steps=5, num_train_epochs=3)
