"""Per-completion cost of `RemoteCodeReward` against the test service (tests/rewards/sandbox_service.py:
SandboxFusion's run_code API on 127.0.0.1, one plain subprocess per run, no sandbox of its own).

64 distinct completions of ``add`` with three assert tests (three runs each: one per call), and
64 stdin/stdout programs with one case (one run each). Reported: the median wall-clock time of
one completion scored alone, and the wall-clock time of the batch of 64 divided by 64 (at most
``max_concurrency=8`` requests in flight). A real service adds its own sandbox start-up and the
network. Run from the repository root:

    .venv/bin/python benchmarks/remote_code_overhead.py
"""
from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "rewards"))
from sandbox_service import running_service  # noqa: E402

from lightning_rlpt.rewards import RemoteCodeReward  # noqa: E402

N = 64
ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"]
VARIANTS = {
    "assert-style, 3 tests": ([f"def add(a, b):\n    return a + b  # {i}" for i in range(N)], ASSERTS),
    "stdin/stdout, 1 case": ([f"a, b = map(int, input().split())\nprint(a + b)  # {i}" for i in range(N)],
                             {"inputs": ["1 2"], "outputs": ["3"]}),
}


def measure(reward: RemoteCodeReward, codes: list[str], row) -> tuple[float, float]:
    """(median ms of one completion alone, ms per completion in one batch of all)."""
    alone = []
    for code in codes:
        start = time.perf_counter()
        assert asyncio.run(reward(["p"], [code], tests=[row])) == [1.0]
        alone.append((time.perf_counter() - start) * 1e3)
    start = time.perf_counter()
    assert asyncio.run(reward(["p"] * len(codes), codes, tests=[row] * len(codes))) == [1.0] * len(codes)
    return statistics.median(alone), (time.perf_counter() - start) * 1e3 / len(codes)


if __name__ == "__main__":
    with running_service() as (url, _):
        reward = RemoteCodeReward(url + "/run_code", max_concurrency=8)
        for label, (codes, row) in VARIANTS.items():
            alone, batched = measure(reward, codes, row)
            print(f"{label}: {alone:.0f} ms per completion alone (median of {N}); {batched:.0f} ms per completion "
                  f"in a batch of {N}")
