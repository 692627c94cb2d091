"""SLURM's requeue signal (``SLURMEnvironment(auto_requeue=True)``) landing in the middle of a step:
the HPC checkpoint is saved at the end of that step, not inside it (`lightning_rlpt.requeue`), the
fit stops there, ``scontrol requeue`` is run, and the requeued fit equals a straight one.

One process, SLURM's variables set by the test and ``scontrol`` a script on PATH that records its
arguments; tests/multinode/test_slurm.py does the same under a real slurmctld with 2 ranks."""
import os
import signal
import stat

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from resume_utils import assert_same_run, read_rows

STEPS, SIGNAL_AT = 6, 2  # the signal arrives while step 2 scores its rollout


@pytest.fixture
def slurm_job(tmp_path, monkeypatch):
    """SLURM's variables for one task of job 4242, and an ``scontrol`` that writes its arguments."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for key, value in dict(SLURM_JOB_ID="4242", SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0",
                           SLURM_NODEID="0", SLURM_JOB_NAME="rl", SLURM_NODELIST="localhost").items():
        monkeypatch.setenv(key, value)
    return calls


def fit(model, root, rows, steps, signal_at=None, ckpt_path=None):
    """A fit under SLURM auto-requeue; with ``signal_at``, SIGUSR1 comes while that step is scored."""
    scored = []

    def reward(prompts, completions, answer, completion_ids, **kw):
        scored.append(1)
        if signal_at is not None and len(scored) == signal_at + 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # as SLURM's --signal=USR1@90, mid-step
        return task.exact_answer(prompts, completions, answer, completion_ids, **kw)

    module = RLModule(model, reward_funcs=[reward], group_size=4, lr=1e-3, seed=5,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    trainer = quiet_trainer(max_steps=steps, default_root_dir=str(root), plugins=[SLURMEnvironment(auto_requeue=True)],
                            logger=CSVLogger(str(root), name="", version="requeued" if ckpt_path else "first"))
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2, seed=7), ckpt_path=ckpt_path)
    return trainer, module


def test_the_requeue_signal_saves_at_the_step_boundary_and_the_requeued_fit_is_exact(
        tmp_path, slurm_job, warm_start_dir, arithmetic_rows):
    first, _ = fit(warm_start_dir, tmp_path / "job", arithmetic_rows, STEPS, signal_at=SIGNAL_AT)
    assert first.global_step == SIGNAL_AT + 1  # step 2 finished, then the fit stopped
    hpc = tmp_path / "job" / "hpc_ckpt_1.ckpt"
    saved = torch.load(hpc, map_location="cpu", weights_only=False)
    assert saved["global_step"] == SIGNAL_AT + 1  # the step the signal landed in is in the checkpoint, whole
    assert slurm_job.read_text().split() == ["requeue", "4242"]

    _, requeued = fit(warm_start_dir, tmp_path / "job", arithmetic_rows, STEPS, ckpt_path="hpc")
    _, straight = fit(warm_start_dir, tmp_path / "straight", arithmetic_rows, STEPS)
    assert_same_run((read_rows(str(tmp_path / "straight")), straight.policy.state_dict()),
                    (read_rows(str(tmp_path / "job")), requeued.policy.state_dict()))
