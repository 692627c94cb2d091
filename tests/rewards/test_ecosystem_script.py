"""docs/ecosystem.md's TRL reward script runs as it stands: TRL's documented reward functions,
unchanged, in a two-step fit on the demo's model."""
import csv
import os
import re

from conftest import ROOT


def _script() -> str:
    text = open(os.path.join(ROOT, "docs", "ecosystem.md")).read()
    section = text.split("## A TRL reward script, unchanged", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_trl_reward_script_runs_and_logs_each_function(tmp_path, monkeypatch):
    code = _script().replace('"examples/arithmetic/warm_start"',
                             repr(os.path.join(ROOT, "examples", "arithmetic", "warm_start")))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/ecosystem.md", "exec"), {"__name__": "__docs__"})
    with open(tmp_path / "runs" / "trl_rewards" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("rewards/reward_len/mean")]
    assert len(rows) == 2
    for name in ("reward_len", "reward_func", "async_reward_func", "math_reward_func"):
        assert all(r[f"rewards/{name}/mean"] != "" for r in rows), name
    assert [float(r["rewards/math_reward_func/none_frac"]) for r in rows] == [0.5, 0.5]
    for r in rows:  # reward_func scores a completion's token count: its mean is the logged mean length
        assert float(r["rewards/reward_func/mean"]) == float(r["completions/mean_length"])
        assert 0.0 <= float(r["rewards/async_reward_func/mean"]) <= 1.0
