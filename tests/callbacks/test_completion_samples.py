"""`CompletionSamples` on real fits: the CSV it writes, its schedule, a W&B-style table API,
and its counters surviving a checkpoint resume."""
import csv
import os

import pytest
from lightning.pytorch.loggers import CSVLogger, Logger

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule
from lightning_rlpt.callbacks import CompletionSamples


class TableLogger(Logger):
    """Stands in for WandbLogger: same ``log_table(key, columns, data, step)`` API, no network."""

    def __init__(self):
        super().__init__()
        self.tables = []

    name, version, experiment = "table", 0, None

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_table(self, key, columns=None, data=None, dataframe=None, step=None):
        self.tables.append((key, columns, data, step))


class DropLastGroup(RLCallback):
    """A filtering callback: returns a smaller experience, so advantages no longer line up."""

    def on_rewards_computed(self, trainer, module, experience):
        import torch
        return experience.select(torch.arange(len(experience) - module.group_size))


def make_module(path):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=1e-3,
                    generation=dict(max_new_tokens=4, max_prompt_length=8))


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_csv_rows_schedule_and_table_api(tmp_path, warm_start_dir, arithmetic_rows):
    table = TableLogger()
    logger = CSVLogger(str(tmp_path), name="run")
    samples = CompletionSamples(every_n_steps=2, num_samples=3)
    trainer = quiet_trainer(max_steps=4, logger=[logger, table], callbacks=[samples])
    trainer.fit(make_module(warm_start_dir), datamodule=PromptDataModule(arithmetic_rows, batch_size=2))

    rows = read(os.path.join(logger.log_dir, "completions.csv"))
    assert [int(r["step"]) for r in rows] == [0, 0, 0, 2, 2, 2]  # rollouts 0 and 2 of 4
    assert list(rows[0]) == ["step", "prompt", "completion", "reward", "reward/exact_answer", "advantage"]
    prompts = {r["prompt"]: r["answer"] for r in arithmetic_rows}
    for r in rows:
        assert r["prompt"] in prompts
        assert float(r["reward"]) == float(r["reward/exact_answer"]) == float(r["completion"] == prompts[r["prompt"]])
        float(r["advantage"])  # filled in once advantages exist
    assert samples.state_dict() == {"rollouts": 4, "rows_written": 6}
    assert [(key, step, len(data)) for key, _, data, step in table.tables] == [("completions", 0, 3), ("completions", 2, 3)]
    assert table.tables[0][1] == list(rows[0])


def test_filtered_batch_keeps_rows_without_advantage(tmp_path, warm_start_dir, arithmetic_rows):
    samples = CompletionSamples(every_n_steps=1, num_samples=2)
    trainer = quiet_trainer(max_steps=1, default_root_dir=str(tmp_path), callbacks=[samples, DropLastGroup()])
    trainer.fit(make_module(warm_start_dir), datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    rows = read(os.path.join(str(tmp_path), "completions.csv"))  # no logger: the trainer's root dir
    assert len(rows) == 2 and all(r["advantage"] == "" for r in rows)


def test_counters_resume_from_checkpoint(tmp_path, warm_start_dir, arithmetic_rows):
    path = str(tmp_path / "samples.csv")
    data = PromptDataModule(arithmetic_rows, batch_size=2)
    first = quiet_trainer(max_steps=2, callbacks=[CompletionSamples(every_n_steps=3, num_samples=1, filename=path)])
    first.fit(make_module(warm_start_dir), datamodule=data)
    first.save_checkpoint(str(tmp_path / "half.ckpt"))

    samples = CompletionSamples(every_n_steps=3, num_samples=1, filename=path)
    second = quiet_trainer(max_steps=4, callbacks=[samples])
    second.fit(make_module(warm_start_dir), datamodule=PromptDataModule(arithmetic_rows, batch_size=2),
               ckpt_path=str(tmp_path / "half.ckpt"))
    assert [int(r["step"]) for r in read(path)] == [0, 3]  # as one uninterrupted run: rollouts 0 and 3
    assert samples.state_dict() == {"rollouts": 4, "rows_written": 2}


def test_bad_arguments():
    with pytest.raises(ValueError, match="every_n_steps and num_samples must be >= 1"):
        CompletionSamples(every_n_steps=0)


def short_answer(completions, **_):
    return [float(len(c) <= 2) for c in completions]


def test_reward_column_is_the_score_under_normalize_then_sum(tmp_path, warm_start_dir, arithmetic_rows):
    """GDPO (``normalize_then_sum``) puts each function's group-normalised sum in
    ``experience.rewards``; the "reward" column is what was scored: the weighted sum of the raw
    per-function columns (0.5·exact + 2·short), as under the default aggregation."""
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer, short_answer], reward_weights=[0.5, 2.0],
                      multi_objective_aggregation="normalize_then_sum", group_size=4, kl_coef=0.0, lr=1e-3,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    trainer = quiet_trainer(max_steps=1, default_root_dir=str(tmp_path),
                            callbacks=[CompletionSamples(every_n_steps=1, num_samples=8)])
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    rows = read(os.path.join(str(tmp_path), "completions.csv"))
    assert len(rows) == 8
    for r in rows:
        expected = 0.5 * float(r["reward/exact_answer"]) + 2.0 * float(r["reward/short_answer"])
        assert float(r["reward"]) == pytest.approx(expected)
