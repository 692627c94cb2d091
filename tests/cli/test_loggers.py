"""A short real fit logged to CSV, TensorBoard and MLflow (file store and SQLite, no server),
checked by reading back what each wrote: the metrics, and the completion-samples table."""
import csv
import glob
import json
import os

import pytest
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.callbacks import CompletionSamples

# val/pass_at_1: a name every logger keeps as it is (MLflow rewrote val/pass@1 as val/pass1, with a warning)
METRICS = ["reward", "kl", "entropy", "completions/mean_length", "val/accuracy", "val/pass_at_1"]
STEPS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory, warm_start_dir, arithmetic_rows, held_out_rows):
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow >= 3.7 asks for this to use ./mlruns-style stores
    root = str(tmp_path_factory.mktemp("loggers"))
    module = RLModule(warm_start_dir, reward_funcs=["tiny_task:exact_answer"], group_size=4, kl_coef=0.05, lr=1e-3,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    data = PromptDataModule(arithmetic_rows, val_data=held_out_rows[:8], batch_size=2, val_batch_size=8)
    loggers = {
        "csv": CSVLogger(root, name="csv"),
        "tb": TensorBoardLogger(root, name="tb"),
        "mlflow": MLFlowLogger("rlpt", tracking_uri=f"file:{root}/mlruns"),
        "mlflow_sqlite": MLFlowLogger("rlpt", tracking_uri=f"sqlite:///{root}/mlflow.db",
                                      artifact_location=f"{root}/mlartifacts"),
    }
    samples = CompletionSamples(every_n_steps=1, num_samples=3)
    trainer = quiet_trainer(max_steps=STEPS, logger=list(loggers.values()), callbacks=[samples],
                            val_check_interval=STEPS, check_val_every_n_epoch=None, enable_progress_bar=True)
    trainer.fit(module, datamodule=data)
    return trainer, loggers, samples


def test_progress_bar_shows_reward_kl_entropy(run):
    trainer, _, _ = run
    assert {"reward", "kl", "entropy"} <= set(trainer.progress_bar_metrics)


def test_csv_metrics(run):
    _, loggers, _ = run
    with open(os.path.join(loggers["csv"].log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    for name in METRICS:
        assert any(r.get(name) not in (None, "") for r in rows), name
    assert os.path.exists(os.path.join(loggers["csv"].log_dir, "completions.csv"))


def test_tensorboard_scalars_and_samples_text(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, loggers, _ = run
    events = EventAccumulator(glob.glob(os.path.join(loggers["tb"].log_dir, "events.out.tfevents.*"))[0],
                              size_guidance={"tensors": 0})
    events.Reload()
    assert set(METRICS) <= set(events.Tags()["scalars"])
    texts = events.Tensors("completions/text_summary")
    assert [t.step for t in texts] == list(range(STEPS))  # one table per rollout, at its global step
    table = texts[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| step | prompt | completion | reward | reward/exact_answer | advantage |")
    assert len(table.splitlines()) == 2 + 3  # header, rule, 3 samples


@pytest.mark.parametrize("name", ["mlflow", "mlflow_sqlite"])
def test_mlflow_metrics_and_table(run, name, tmp_path):
    from mlflow.tracking import MlflowClient

    _, loggers, _ = run
    logger = loggers[name]
    client = MlflowClient(logger._tracking_uri)
    for metric in METRICS:
        assert client.get_metric_history(logger.run_id, metric), metric
    assert len(client.get_metric_history(logger.run_id, "reward")) == STEPS
    path = client.download_artifacts(logger.run_id, "completions.json", dst_path=str(tmp_path))
    with open(path) as f:
        table = json.load(f)
    assert table["columns"][:4] == ["step", "prompt", "completion", "reward"]
    assert len(table["data"]) == 3 * STEPS  # MLflow appends each step's rows to the same table
    assert {row[1] for row in table["data"]} <= {r["prompt"] for r in task.rows(task.split_pairs()[0])}
