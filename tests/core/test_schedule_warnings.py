"""Where a schedule that follows the run cannot be what the user expects, it says so: a resume with
a longer run that moves a fractional warm-up past the restored step, and epochs that may end
before ``max_steps`` when ``minibatch_size`` makes the steps per rollout unknown."""
import functools
import os
import warnings

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.optim import WarmupLinearLR


def _schedule(total_steps, warmup_steps, steps_taken=0):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupLinearLR(opt, total_steps=total_steps, warmup_steps=warmup_steps)
    for _ in range(steps_taken):
        opt.step()
        sched.step()
    return sched, opt


def test_a_longer_resume_that_puts_the_step_back_inside_a_fractional_warmup_warns():
    """Saved at step 4 of 4 (warm-up 0.25 → 1 step); resumed with 20 steps, the warm-up is 5 steps:
    step 4 is back inside it (rate 4/5 instead of the decay's)."""
    saved, _ = _schedule(4, 0.25, steps_taken=4)
    resumed, opt = _schedule(20, 0.25)
    with pytest.warns(UserWarning, match=r"WarmupLinearLR: resumed at optimizer step 4, past the checkpoint's "
                                         r"warm-up \(1 steps\), but warmup_steps=0.25 of this run's 20 steps is 5: "
                                         r"the learning rate drops back to 4/5.*Give warmup_steps=1 \(an int\)"):
        resumed.load_state_dict(saved.state_dict())
    assert opt.param_groups[0]["lr"] == pytest.approx(0.8)
    with warnings.catch_warnings():  # the same length, or a step still inside the saved warm-up: nothing moved
        warnings.simplefilter("error")
        _schedule(4, 0.25)[0].load_state_dict(saved.state_dict())
        _schedule(20, 0.25)[0].load_state_dict(_schedule(8, 0.25, steps_taken=1)[0].state_dict())
        old = saved.state_dict()
        del old["saved_warmup_steps"]  # a checkpoint from before: the old warm-up is unknown
        _schedule(20, 0.25)[0].load_state_dict(old)


def test_the_warning_reaches_a_real_resume(tmp_path, warm_start_dir, arithmetic_rows):
    ckpt = str(tmp_path / "ckpt")
    schedule = functools.partial(WarmupLinearLR, warmup_steps=0.25)

    def fit(max_steps, resume):
        module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=0.01,
                          generation=dict(max_new_tokens=4, max_prompt_length=8), lr_scheduler=schedule)
        callbacks = [] if resume else [ModelCheckpoint(dirpath=ckpt, save_last=True, every_n_train_steps=max_steps)]
        trainer = quiet_trainer(max_steps=max_steps, callbacks=callbacks, enable_checkpointing=not resume)
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2),
                    ckpt_path=os.path.join(ckpt, "last.ckpt") if resume else None)

    fit(4, resume=False)
    with pytest.warns(UserWarning, match=r"resumed at optimizer step 4, past the checkpoint's warm-up \(1 steps\)"):
        fit(20, resume=True)  # warm-up ceil(0.25 · 20) = 5 steps


def _fit_epochs(warm_start_dir, rows, **trainer_kwargs):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=0.01,
                      generation=dict(max_new_tokens=4, max_prompt_length=8), minibatch_size=8,
                      lr_scheduler=WarmupLinearLR)
    quiet_trainer(**trainer_kwargs).fit(module, datamodule=PromptDataModule(rows, batch_size=2))


def test_epochs_that_may_end_before_max_steps_under_minibatch_size_warn(warm_start_dir, arithmetic_rows):
    """One epoch of 2 rollouts and max_steps=50: with minibatch_size the steps per rollout are
    unknown, so the schedule is fitted to 50 though the epoch may end long before."""
    with pytest.warns(UserWarning, match=r"WarmupLinearLR follows the run's max_steps=50 optimizer steps, but the 1 "
                                         r"epochs \(2 rollouts\) may end first.*Set Trainer\(max_epochs=-1\)"):
        _fit_epochs(warm_start_dir, arithmetic_rows[:4], max_epochs=1, max_steps=50)
    with warnings.catch_warnings():  # 2 rollouts of at least one step each reach max_steps=2: it bounds the run
        warnings.filterwarnings("error", message=".*may end first")
        _fit_epochs(warm_start_dir, arithmetic_rows[:4], max_epochs=1, max_steps=2)
