"""Timing and throughput metrics: each stage's seconds every step, tokens/s in the progress bar."""
import csv
import time

import pytest
from lightning.pytorch.loggers import CSVLogger

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.stages.timing import StepTimer

STAGES = ["timing/rollout", "timing/rewards", "timing/ref_logprobs", "timing/update", "timing/weight_sync"]


def test_every_stage_is_timed_every_step_and_tokens_per_s_reach_the_progress_bar(warm_start_dir, arithmetic_rows,
                                                                                  tmp_path):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.1,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    trainer = quiet_trainer(max_steps=3, logger=CSVLogger(tmp_path, name="", version=""))
    start = time.perf_counter()
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    wall = time.perf_counter() - start
    with open(tmp_path / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("timing/update")]
    assert len(rows) == 3
    seconds = [[float(row[k]) for k in STAGES] for row in rows]
    assert all(s > 0 for step in seconds for s in step)
    assert sum(map(sum, seconds)) < wall  # the stages are parts of the steps, not more
    assert all(float(row["throughput/tokens_per_s"]) > 0 for row in rows)
    assert "throughput/tokens_per_s" in trainer.progress_bar_metrics


def test_step_timer_adds_up_repeated_stages_and_starts_afresh_after_pop():
    timer = StepTimer()
    for _ in range(2):
        with timer("rollout"):
            time.sleep(0.02)
    seconds = timer.pop()
    assert seconds["timing/rollout"] == pytest.approx(0.04, abs=0.03)
    assert timer.pop() == {}
