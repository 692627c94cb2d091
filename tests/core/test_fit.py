"""Short real fits on CPU: full fine-tune, LoRA and QLoRA (bitsandbytes 4-bit), logging every
metric to a CSV and a TensorBoard logger, checked by reading the files they wrote."""
import csv
import glob
import os

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule

METRICS = ["reward", "reward_std", "reward_group_std", "frac_reward_zero_std", "completions/mean_length",
           "completions/clipped_ratio", "completions/mean_terminated_length", "num_tokens", "learning_rate",
           "step_time", "kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/low_min",
           "clip_ratio/high_max", "loss", "rewards/exact_answer/mean", "rewards/exact_answer/std", "val/accuracy",
           "val/pass_at_1", "val/pass_at_2"]

MODES = {
    "full": {},
    "lora": {"lora": dict(r=4, lora_alpha=8)},
    "qlora": {"lora": dict(r=4, lora_alpha=8), "quantization": "nf4"},
}


def _trainable(module):
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("mode", list(MODES))
def test_fit_logs_every_metric_to_csv_and_tensorboard(mode, tmp_path, warm_start_dir, arithmetic_rows, held_out_rows):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.05, lr=1e-3,
                      updates_per_rollout=2, minibatch_size=8, val_samples=2,
                      val_generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8),
                      generation=dict(max_new_tokens=4, max_prompt_length=8), **MODES[mode])
    before = _trainable(module)
    data = PromptDataModule(arithmetic_rows, val_data=held_out_rows[:8], batch_size=4, val_batch_size=8)
    loggers = [CSVLogger(str(tmp_path), name="csv"), TensorBoardLogger(str(tmp_path), name="tb")]
    trainer = quiet_trainer(max_steps=8, logger=loggers, val_check_interval=1, check_val_every_n_epoch=None)
    trainer.fit(module, datamodule=data)

    assert trainer.global_step == 8  # 2 rollouts × μ=2 passes × 2 mini-batches of 8 of the 16 rows
    after = _trainable(module)
    assert before.keys() == after.keys() and len(before) > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    if mode != "full":
        assert all("lora_" in k for k in before)
    if mode == "qlora":
        import bitsandbytes as bnb
        assert any(isinstance(m, bnb.nn.Linear4bit) for m in module.policy.modules())

    with open(os.path.join(loggers[0].log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    # A name that is also another's folder (`x` and `x/y`) breaks loggers that store one file per
    # metric (MLflow's file store: "Not a directory").
    names = set(rows[0])
    assert not [(a, b) for a in names for b in names if b.startswith(a + "/")]
    for name in METRICS:
        values = [float(r[name]) for r in rows if r.get(name) not in (None, "")]
        assert values, f"{name} missing from metrics.csv"
        assert all(v == v for v in values), f"{name} has NaN"

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(glob.glob(os.path.join(loggers[1].log_dir, "events.out.tfevents.*"))[0])
    events.Reload()
    assert set(METRICS) <= set(events.Tags()["scalars"])
