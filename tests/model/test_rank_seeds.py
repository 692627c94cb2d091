"""Issue 23 item 1: each data-parallel rank draws its own rollout seeds (the same prompt on two
ranks gets different completions), and a run resumed from rank 0's checkpoint draws, on every
rank, what the uninterrupted run drew."""
import json
import os
import subprocess
import sys

import pytest
from conftest import TESTS

from lightning_rlpt.seeding import keyed_generator

SCRIPT = os.path.join(TESTS, "scripts", "rank_seeds_fit.py")


def test_rollout_stream_is_keyed_by_seed_rank_and_draw():
    def first(*keys):
        return keyed_generator("rollout", *keys).initial_seed()  # what RLModule draws from

    assert first(3, 0, 5) == first(3, 0, 5)
    assert len({first(3, 0, 5), first(3, 1, 5), first(3, 0, 6), first(4, 0, 5)}) == 4


@pytest.mark.slow
def test_ddp_ranks_sample_the_same_prompt_differently_and_resume_exactly(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path), "--steps", "3"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.load(open(tmp_path / f"completions_rank{r}.json")) for r in (0, 1))
    for rank in (r0, r1):
        assert [s for s, _ in rank["straight"]] == [0, 1, 2]
        assert rank["resumed"] == rank["straight"], "the resumed run sampled other completions than the straight one"
    for (step, a), (_, b) in zip(r0["straight"], r1["straight"]):
        assert a != b, f"step {step}: both ranks sampled the same completions for the same prompt"
