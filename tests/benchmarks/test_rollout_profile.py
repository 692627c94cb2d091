"""`benchmarks/rollout_profile.py`: a part's time is its own (what it contains is taken out once),
and every named part is found in the installed transformers and vLLM (a renamed function would
otherwise read as 0 % and move its time to "other")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import rollout_profile  # noqa: E402


def _stats(entries):
    """A stand-in for `pstats.Stats`: ``(file, func, cumulative seconds)`` rows."""
    return SimpleNamespace(stats={(file, i, func): (1, 1, 0.0, ct, {}) for i, (file, func, ct) in enumerate(entries)})


def test_each_part_is_its_own_time_and_a_nested_match_counts_once():
    stats = _stats([("/x/transformers/models/llama/modeling_llama.py", "forward", 2.0),  # LlamaForCausalLM
                    ("/x/transformers/models/llama/modeling_llama.py", "forward", 1.5),  # LlamaModel, inside it
                    ("/x/lightning_rlpt/rollout/sampling/per_row.py", "__call__", 1.0),
                    ("/x/transformers/generation/utils.py", "_sample", 3.5),
                    ("/x/lightning_rlpt/rollout/hf.py", "generate", 4.0)])
    parts = rollout_profile.split(stats, "hf")
    assert parts == {"model forward": 2.0, "sampler (RowSampler: inverse CDF over the processed softmax)": 1.0,
                     "generate() loop": 0.5, "engine call (ours, around generate)": 0.5}


@pytest.mark.slow
def test_a_quick_run_finds_every_part_in_both_engines(tmp_path):
    out = tmp_path / "rp.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "rollout_profile.py"), "--quick",
                           "--idle-wait", "0", "--retries", "0", "--results", str(out)],
                          capture_output=True, text=True, timeout=400, cwd=os.path.join(ROOT, "benchmarks"))
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    for engine, result in data["engines"].items():
        shares = result["shares"]
        assert set(shares) == {*rollout_profile.PARTS[engine], "other"}
        missing = [part for part in rollout_profile.PARTS[engine] if shares[part] <= 0]
        assert not missing, f"{engine}: no time found for {missing} (renamed upstream?)"
        assert 0.9 < sum(shares.values()) < 1.1 and result["tokens"] > 0
