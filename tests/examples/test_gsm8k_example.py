"""examples/gsm8k_rl.py: GSM8K's reference extraction, its agreement with math_answer_reward on
every shipped row, and a 2-step run as a script with accuracy logged before and after."""
import csv
import json
import os
import sys

import pytest
from conftest import ROOT
from example_process import run_example

from lightning_rlpt import math_answer_reward

EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)  # gsm8k_rl imports its sibling math_rl, as it does when run as a script
try:
    import gsm8k_rl  # noqa: E402
finally:
    sys.path.remove(EXAMPLES)  # leave no examples/ module (distributed.py, ...) shadowing others


@pytest.mark.parametrize("answer, reference", [
    ("She bakes 12 + 60 = <<12+60=72>>72 cookies.\n#### 72", "72"),
    ("#### 1,200", "1200"),  # GSM8K writes some thousands with commas; the benchmark removes them
    ("He types '####' by mistake, then 4 + 5 = <<4+5=9>>9 lines.\n#### 9", "9"),  # the last #### counts
    ("It falls to 4 - 11 = <<4-11=-7>>-7 degrees.\n####  -7 \n", "-7"),
])
def test_extract_reference_takes_the_number_after_the_last_marker(answer, reference):
    assert gsm8k_rl.extract_reference(answer) == reference


@pytest.mark.parametrize("answer, says", [("So the answer is 72.", "has no '####'"), ("#### seventy", "not a number"),
                                          ("#### ", "not a number")])
def test_extract_reference_refuses_an_answer_without_a_number_after_the_marker(answer, says):
    with pytest.raises(ValueError, match=says):
        gsm8k_rl.extract_reference(answer)


def test_a_row_without_the_marker_stops_loading_and_names_the_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    rows = [{"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}, {"question": "2 + 2?", "answer": "2 + 2 = 4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Not a silent zero: the reward would score that row 0 whatever the model said.
    with pytest.raises(ValueError, match=rf"row 1 of '{path}' .*has no '####'"):
        gsm8k_rl.gsm8k_rows(str(path))


def test_shipped_rows_become_prompts_and_benchmark_references():
    rows = gsm8k_rl.gsm8k_rows(gsm8k_rl.DATA)
    assert len(rows) == 12 and all(set(r) == {"prompt", "answer"} for r in rows)
    assert all(r["prompt"].endswith(gsm8k_rl.INSTRUCTION) for r in rows)
    assert "1200" in [r["answer"] for r in rows]  # the file's '#### 1,200' row, commas removed


def test_parquet_in_the_same_schema_gives_the_same_rows(tmp_path):
    import datasets

    with open(gsm8k_rl.DATA) as f:
        raw = [json.loads(line) for line in f]
    datasets.Dataset.from_list(raw).to_parquet(str(tmp_path / "train.parquet"))  # as openai/gsm8k ships it
    assert gsm8k_rl.gsm8k_rows(str(tmp_path / "train.parquet")) == gsm8k_rl.gsm8k_rows(gsm8k_rl.DATA)


def test_reward_scores_each_shipped_solution_1_and_a_wrong_answer_0():
    """The reference solution, its '#### N' line written as the <answer> block the prompt asks for,
    scores 1.0 against the extracted reference on every row; N + 1 scores 0.0. N is read here from
    the raw line, commas kept, so extraction and reward are checked against each other."""
    with open(gsm8k_rl.DATA) as f:
        raw = [json.loads(line) for line in f]
    references = [r["answer"] for r in gsm8k_rl.gsm8k_rows(gsm8k_rl.DATA)]
    steps = [r["answer"].rsplit("\n", 1)[0] for r in raw]
    finals = [r["answer"].rsplit("\n", 1)[1].removeprefix("#### ") for r in raw]
    assert "1,200" in finals
    right = [f"{s}\n<answer>{n}</answer>" for s, n in zip(steps, finals)]
    wrong = [f"{s}\n<answer>{int(n.replace(',', '')) + 1}</answer>" for s, n in zip(steps, finals)]
    prompts = [r["question"] for r in raw]
    assert math_answer_reward(prompts, right, answer=references) == [1.0] * len(raw)
    assert math_answer_reward(prompts, wrong, answer=references) == [0.0] * len(raw)


def test_gsm8k_example_runs_and_logs_accuracy_before_and_after(tmp_path):
    proc = run_example("gsm8k_rl.py", ["--steps", "2"], tmp_path)
    assert "greedy pass@1 (mean math reward) on 12 prompts: before" in proc.stdout
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    # validate() before fit, the 2 training steps, validate() after: one row each, in that order
    assert [r["step"] for r in rows] == ["0", "0", "1", "2"]
    before, *train, after = rows
    for name in ["reward", "rewards/math_answer/mean", "rewards/math_answer/failures", "grad_norm"]:
        assert all(r[name] != "" for r in train), name
    assert all(float(r["rewards/math_answer/failures"]) == 0 for r in train)  # no reward call failed on noise
    assert all(0 <= float(r["rewards/math_answer/mean"]) <= 1 for r in train)
    for row in (before, after):  # one reward, so accuracy (score >= 1) is the mean math reward
        assert row["val/accuracy"] != "" and 0 <= float(row["val/accuracy"]) <= 1
        assert float(row["val/accuracy"]) == pytest.approx(float(row["val/reward"])) and row["reward"] == ""
