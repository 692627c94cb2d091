"""`WarmupLinearLR` (TRL's default ``lr_scheduler_type="linear"``) by hand and against transformers',
and a schedule's length following the run (issue 26 item 7): left out, it is the Trainer's
``max_steps`` (or epochs × batches × updates per rollout), also after a resume with a larger
``max_steps``; given and shorter than the run, a warning; unknown, refused at fit start."""
import functools
import os
import warnings

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.optim import WarmupCosineLR, WarmupLinearLR

LR = 0.01


def _factors(make, steps):
    """The factor of steps 0..steps-1 of the LambdaLR ``make(optimizer)`` builds."""
    scheduler = make(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
    return [scheduler.lr_lambdas[0](s) for s in range(steps)]


def test_warmup_linear_values_by_hand():
    # warm-up 2: 0, 1/2; then 1 - p with p = (s - 2) / 4, floor 0.2: 0.2 + 0.8 (1 - p)
    lrs = _factors(functools.partial(WarmupLinearLR, total_steps=6, warmup_steps=2, min_lr_ratio=0.2), 8)
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2], abs=1e-12)


def test_warmup_linear_equals_transformers_linear_schedule():
    from transformers import get_linear_schedule_with_warmup

    ours = _factors(functools.partial(WarmupLinearLR, total_steps=50, warmup_steps=7), 55)
    theirs = _factors(lambda opt: get_linear_schedule_with_warmup(opt, 7, 50), 55)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15)
    stepped = []  # and the rates a stepped optimizer really gets
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-5)
    scheduler = WarmupLinearLR(opt, total_steps=50, warmup_steps=7)
    for _ in range(55):
        stepped.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert stepped == pytest.approx([3e-5 * f for f in theirs], rel=1e-9, abs=1e-15)


def test_a_warmup_fraction_rounds_up_as_transformers_does():
    # transformers' TrainingArguments.get_warmup_steps: ceil(10 × 0.25) = 3 warm-up steps
    lrs = _factors(functools.partial(WarmupLinearLR, total_steps=10, warmup_steps=0.25), 4)
    assert lrs == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])


class RecordLR(Callback):
    """The learning rate of every optimizer step, read just before the step."""

    def __init__(self):
        self.lrs = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"] / LR)


def _module(path, schedule, **kwargs):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=LR, seed=0,
                    generation=dict(max_new_tokens=4, max_prompt_length=8), max_grad_norm=None,
                    lr_scheduler=schedule, **kwargs)


def _fit(path, schedule, rows, ckpt_dir=None, resume=False, module_kwargs=None, **trainer_kwargs):
    record = RecordLR()
    callbacks = [record]
    if ckpt_dir is not None and not resume:  # one checkpoint, at the end of the first part
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=-1,
                                         every_n_train_steps=trainer_kwargs["max_steps"]))
    trainer = quiet_trainer(callbacks=callbacks, enable_checkpointing=ckpt_dir is not None and not resume,
                            **trainer_kwargs)
    trainer.fit(_module(path, schedule, **(module_kwargs or {})), datamodule=PromptDataModule(rows, batch_size=2),
                ckpt_path=os.path.join(ckpt_dir, "last.ckpt") if resume else None)
    return record.lrs


def test_a_schedule_without_length_follows_max_steps_and_a_resume_with_more(tmp_path, warm_start_dir, arithmetic_rows):
    """4 steps, then resumed to 8: warm-up 1, then (T - s) / (T - 1) with T the run's max_steps."""
    schedule = functools.partial(WarmupLinearLR, warmup_steps=1)
    ckpt = str(tmp_path / "ckpt")
    first = _fit(warm_start_dir, schedule, arithmetic_rows, ckpt, max_steps=4)
    assert first == pytest.approx([0.0, 1.0, 2 / 3, 1 / 3])
    resumed = _fit(warm_start_dir, schedule, arithmetic_rows, ckpt, resume=True, max_steps=8)
    # the restored position (step 4) under the longer schedule: (8 - s) / 7, not the old floor 0
    assert resumed == pytest.approx([4 / 7, 3 / 7, 2 / 7, 1 / 7])


def test_a_given_length_shorter_than_the_run_warns_and_sits_at_the_floor(tmp_path, warm_start_dir, arithmetic_rows):
    schedule = functools.partial(WarmupCosineLR, total_steps=2, min_lr_ratio=0.1)
    with pytest.warns(UserWarning, match=r"WarmupCosineLR\(total_steps=2\) is shorter than this run's 3 optimizer "
                                         r"steps: the learning rate will sit at its floor .* for the last 1"):
        lrs = _fit(warm_start_dir, schedule, arithmetic_rows, max_steps=3)
    assert lrs == pytest.approx([1.0, 0.55, 0.1])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*is shorter than this run")
        _fit(warm_start_dir, schedule, arithmetic_rows, max_steps=2)  # long enough: no warning


def test_under_max_epochs_the_length_counts_every_update_of_every_batch(warm_start_dir, arithmetic_rows):
    """One epoch of 2 batches × updates_per_rollout 2 = 4 optimizer steps: 1 - s/4."""
    lrs = _fit(warm_start_dir, WarmupLinearLR, arithmetic_rows[:4], max_epochs=1,
               module_kwargs=dict(updates_per_rollout=2))
    assert lrs == pytest.approx([1.0, 0.75, 0.5, 0.25])


def test_an_unknown_length_is_refused_at_fit_start(warm_start_dir, arithmetic_rows):
    module = _module(warm_start_dir, functools.partial(WarmupLinearLR, warmup_steps=2), minibatch_size=4)
    trainer = quiet_trainer(max_epochs=1)
    with pytest.raises(ValueError, match=r"WarmupLinearLR has no total_steps and the run's length is unknown .*"
                                         r"set Trainer\(max_steps=...\) or pass total_steps"):
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    assert module.policy_version == 0  # before any rollout


@pytest.mark.parametrize("kwargs, message", [
    (dict(total_steps=4, warmup_steps=4), r"needs 0 <= warmup_steps < total_steps \(got warmup_steps=4, total_steps=4\)"),
    (dict(warmup_steps=-1), r"warmup_steps must be an int >= 0 .* or a float in \[0, 1\)"),
    (dict(warmup_steps=2.5), r"warmup_steps must be an int >= 0"),
    (dict(min_lr_ratio=1.5), r"min_lr_ratio must be in \[0, 1\]"),
])
def test_bad_settings_are_refused(kwargs, message):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=message):
        WarmupLinearLR(opt, **kwargs)


def test_a_schedule_without_length_refuses_to_step_outside_rlmodule():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupCosineLR(opt)
    opt.step()
    with pytest.raises(ValueError, match=r"stepped without a length: pass total_steps"):
        sched.step()
