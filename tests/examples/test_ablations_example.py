"""examples/ablations.py, shortened: two arms, one seed, a few steps, as a user runs it. Its JSON
holds what the docs' table is rendered from (`ablations_report`), and the table the script wrote
is that rendering: the page and the script cannot drift."""
import json
import os
import sys

from conftest import ROOT
from example_process import run_example

sys.path.insert(0, os.path.join(ROOT, "examples"))
import ablations_report  # noqa: E402  (examples/ablations_report.py: imports nothing heavy)


def test_a_short_ablation_writes_the_json_the_docs_render(tmp_path):
    run_example("ablations.py", ["--steps", "4", "--seeds", "0", "--arms", "grpo", "reward_dithering",
                                 "--dev-prompts", "16", "--val-every", "2", "--json", str(tmp_path / "a.json")],
                tmp_path, timeout=400)
    data = json.load(open(tmp_path / "a.json"))
    assert list(data["results"]) == ["grpo", "reward_dithering"] and data["settings"]["steps"] == 4
    for arm in data["results"].values():
        assert 0 <= arm["test_accuracy"] <= 1 and [s for s, _ in arm["curve"]] == [2, 4]
    table = ablations_report.table(data)
    assert open(tmp_path / "ablations.md").read() == table + "\n"
    assert "| grpo |" in table and "| reward_dithering |" in table and "4 GRPO steps per arm and seed" in table
    assert "GRPO's final test accuracy is" in ablations_report.summary(data)
    assert os.path.getsize(tmp_path / "ablations.png") > 10_000
