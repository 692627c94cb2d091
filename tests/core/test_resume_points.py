"""Issue 37 item 3: a run resumed from *any* checkpoint a user has continues exactly as the
straight run: the end-of-fit ``last.ckpt`` (an epoch cut short by ``max_steps``), the end of a
whole epoch after its validation, ``every_n_train_steps``, the ``OnExceptionCheckpoint`` of a
crash, and a run resumed twice across an epoch's end. Compared step by step with one straight
run (every logged metric under the same step label, the final weights).

Seen failing before the fix (`checkpoint.mark_epoch_end`): from the end-of-fit ``last.ckpt``
step 3 differed (the loader's state read ``{'consumed': 2, 'epoch': 1}``: a new permutation);
after a whole epoch the next epoch's prompts were skipped and the step labels ran one ahead
(11-14 after 0-9)."""
import glob
import os
import random
import subprocess
import sys
import time

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.loggers import CSVLogger

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.checkpoint_io import AtomicCheckpointIO
from resume_utils import assert_same_run, read_rows

STEPS = 14  # 10 batches an epoch: the runs cross one epoch's end


CRASH_IN_REWARD = {"step": None}


def brevity(prompts, completions, trainer_state=None, **_):
    """A second reward, as in the review's set-up (two rewards, each logged); it raises once at
    ``CRASH_IN_REWARD["step"]`` (a reward service that fails mid-rollout)."""
    if trainer_state is not None and trainer_state.global_step == CRASH_IN_REWARD["step"]:
        CRASH_IN_REWARD["step"] = None
        raise RuntimeError(f"crash at step {trainer_state.global_step}")
    return [-0.1 * len(c) for c in completions]


class CrashAt(Callback):
    """Raises once, at the start of step ``step`` (a crash mid-run)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError(f"crash at step {self.step}")


def builders(warm_start_dir, arithmetic_rows, held_out_rows):
    """``(make_module, make_data)`` of the run (also used by tests/durability/killed_fit.py)."""
    def make_module():
        return RLModule(warm_start_dir, reward_funcs=[task.exact_answer, brevity], group_size=4, lr=1e-3, seed=5,
                        generation=dict(max_new_tokens=4, max_prompt_length=8))

    def make_data():
        return PromptDataModule(arithmetic_rows[:40], val_data=held_out_rows[:4], batch_size=4, seed=7)
    return make_module, make_data


@pytest.fixture(scope="module")
def setting(warm_start_dir, arithmetic_rows, held_out_rows):
    return builders(warm_start_dir, arithmetic_rows, held_out_rows)


def fit_part(setting, root, part: int, steps: int, ckpt_path=None, extra=(), every: int = 4):
    """One fit of the run in ``root``: the example config's end-of-fit ``last.ckpt`` plus a
    checkpoint every ``every`` steps; validation at each epoch's end. Returns the module."""
    make_module, make_data = setting
    ckpt_dir = os.path.join(root, "ckpt")
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_on_train_epoch_end=True,
                                 enable_version_counter=False),
                 ModelCheckpoint(dirpath=ckpt_dir, filename="every-{step}", every_n_train_steps=every, save_top_k=-1),
                 *extra]
    trainer = quiet_trainer(max_steps=steps, logger=CSVLogger(root, name="", version=f"part{part}"),
                            callbacks=callbacks, enable_checkpointing=True)
    module = make_module()
    trainer.fit(module, datamodule=make_data(), ckpt_path=ckpt_path and os.path.join(ckpt_dir, ckpt_path))
    return module


def outcome(root, module):
    return read_rows(root), {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


@pytest.fixture(scope="module")
def straight(setting, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("straight"))
    return outcome(root, fit_part(setting, root, 0, STEPS))


@pytest.mark.parametrize("plan", [
    [(3, None), (STEPS, "last.ckpt")],                      # the end-of-fit last.ckpt, mid-epoch
    [(10, None), (STEPS, "last.ckpt")],                     # a whole epoch, ended by its validation
    [(6, None), (STEPS, "every-step=4.ckpt")],              # every_n_train_steps, older than the last
    [(3, None), (12, "last.ckpt"), (STEPS, "last.ckpt")],   # resumed twice, across the epoch's end
], ids=["end-of-fit-last", "end-of-epoch-after-validation", "every-n-steps", "twice"])
def test_resume_from_each_checkpoint_is_exact(setting, straight, tmp_path, plan):
    root = str(tmp_path)
    for part, (steps, ckpt) in enumerate(plan):
        module = fit_part(setting, root, part, steps, ckpt)
    assert sorted(straight[0]) == list(range(STEPS))  # the labels a straight run logs
    assert_same_run(straight, outcome(root, module))


@pytest.mark.parametrize("where", ["batch-start", "reward"])
def test_resume_from_the_checkpoint_of_a_crash_is_exact(setting, straight, tmp_path, where):
    """The crash's batch is replayed (same prompts, same rollout seed), its step label kept."""
    root = str(tmp_path)
    crash = OnExceptionCheckpoint(dirpath=os.path.join(root, "ckpt"), filename="on_exception")
    CRASH_IN_REWARD["step"] = 5 if where == "reward" else None
    with pytest.raises(Exception, match="crash at step 5"):
        fit_part(setting, root, 0, STEPS, extra=[crash, *([CrashAt(5)] if where == "batch-start" else [])])
    module = fit_part(setting, root, 1, STEPS, "on_exception.ckpt")
    assert_same_run(straight, outcome(root, module))


def test_an_end_of_fit_checkpoint_records_the_epoch_unfinished(setting, tmp_path):
    """The loops of the end-of-fit ``last.ckpt`` read as at its last batch's end (fast check of the fix)."""
    fit_part(setting, str(tmp_path), 0, 3)
    loops = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["loops"]["fit_loop"]
    assert loops["epoch_progress"]["current"] == dict(ready=1, started=1, processed=0, completed=0)
    assert loops["epoch_loop.batch_progress"]["current"]["completed"] == 2
    assert loops["state_dict"]["combined_loader"] == [{"consumed": 3, "epoch": 0}]


@pytest.mark.slow
def test_a_fit_killed_mid_run_resumes_exactly_from_its_newest_checkpoint(setting, straight, tmp_path):
    """Issue 37 item 5 with a real fit: its process SIGKILLed at a random moment (a checkpoint every
    step, on /dev/shm, ``$TMPDIR`` on /): every checkpoint left loads, the newest resumes exactly,
    nothing is left in ``$TMPDIR``."""
    ckpt_root = f"/dev/shm/rlpt-killed-{os.getpid()}"
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no /dev/shm on another filesystem than the test's temp directory")
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    try:
        newest = kill_a_fit(ckpt_root, str(tmpdir), seed=37)
        resumed_root = str(tmp_path / "resumed")
        module = fit_part(setting, resumed_root, 1, STEPS, os.path.join(ckpt_root, "ckpt", newest))
    finally:
        subprocess.run(["rm", "-rf", ckpt_root], check=False)
    rows, weights = outcome(resumed_root, module)
    assert rows and all(straight[0][step] == values for step, values in rows.items())  # same labels, same values
    assert_same_run(({}, straight[1]), ({}, weights))
    assert [f for _, _, files in os.walk(tmpdir) for f in files] == []


def kill_a_fit(root: str, tmpdir: str, seed: int) -> str:
    """Start killed_fit.py, SIGKILL it at a random moment once two checkpoints exist; check that
    every checkpoint left loads; return the newest one's file name."""
    ckpt_dir = os.path.join(root, "ckpt")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "durability", "killed_fit.py")
    proc = subprocess.Popen([sys.executable, script, root, str(STEPS)], env={**os.environ, "TMPDIR": tmpdir},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(glob.glob(os.path.join(ckpt_dir, "every-step=*.ckpt"))) < 2 and proc.poll() is None:
            assert time.monotonic() < deadline, "the fit wrote no checkpoint in 120 s"
            time.sleep(0.02)
        time.sleep(random.Random(seed).uniform(0.0, 0.3))
    finally:
        proc.kill()
        proc.wait()
    names = [os.path.basename(p) for p in glob.glob(os.path.join(ckpt_dir, "*.ckpt"))]
    for name in names:
        AtomicCheckpointIO().load_checkpoint(os.path.join(ckpt_dir, name))  # each one whole
    return max((n for n in names if n.startswith("every-")), key=lambda n: int(n[len("every-step="):-5]))


def test_an_epoch_based_run_resumes_exactly_from_its_epoch_end_checkpoint(setting, tmp_path):
    """``max_epochs`` instead of ``max_steps`` (Lightning resumes those by another path): 1 epoch, then 2."""
    make_module, make_data = setting
    runs = []
    for name, plan in (("straight", [2]), ("resumed", [1, 2])):
        root = str(tmp_path / name)
        for part, epochs in enumerate(plan):
            trainer = quiet_trainer(max_epochs=epochs, logger=CSVLogger(root, name="", version=f"part{part}"),
                                    enable_checkpointing=True, callbacks=[ModelCheckpoint(
                                        dirpath=os.path.join(root, "ckpt"), save_last=True, enable_version_counter=False)])
            module = make_module()
            trainer.fit(module, datamodule=make_data(), ckpt_path=os.path.join(root, "ckpt", "last.ckpt") if part else None)
        runs.append(outcome(root, module))
    assert sorted(runs[0][0]) == list(range(20))
    assert_same_run(*runs)
