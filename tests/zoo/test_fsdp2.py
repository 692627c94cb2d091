"""Two zoo architectures under FSDP2 (2 gloo processes, the HF engine): the tied head with qkv
bias (Qwen2.5) and the soft-capped, scaled-embedding, tied Gemma-2. Each rank's sampling
log-probs equal the sharded trainer's at step 0 and after one update (the sharded forward holds
the tied head once; a wrong gather or a head left out of the shards shows as 1e-2 .. 1)."""
import json
import os
import subprocess
import sys

import pytest

from architectures import BY_NAME
from conformance import TOLERANCE
from conftest import TESTS

SCRIPT = os.path.join(TESTS, "scripts", "zoo_fsdp2_fit.py")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5", "gemma2"])
def test_fsdp2_samples_from_the_sharded_policy(name, tmp_path):
    model = BY_NAME[name].save(str(tmp_path / name))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, SCRIPT, "--model", model, "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        rows = json.loads((tmp_path / f"gaps_rank{rank}.json").read_text())
        assert [row["step"] for row in rows] == [0, 1], rows
        assert all(row["mean"] <= TOLERANCE and row["max"] <= 10 * TOLERANCE for row in rows), (rank, rows)
