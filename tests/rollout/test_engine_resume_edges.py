"""Where an engine's weights and a checkpoint can part ways, each case said or refused, never
trained on silently: a checkpoint generated further ahead than the resumed run allows, one saved
between two weight syncs, a refused ``max_staleness`` that would strand the engine already built,
a callback reused after a resume, a forced sync that does not land, and a rollout staler than
``sync_every`` and ``max_staleness`` allow. Uses the contract-only engine of test_custom_engine.py."""
import os
import warnings

import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule
from lightning_rlpt.callbacks import CurriculumSampler
from lightning_rlpt.rollout.contract import staleness_metrics
from resume_utils import assert_same_run, straight_and_resumed
from test_custom_engine import CopyEngine, CopyRollout, Versions, make_module


def data(rows):
    return PromptDataModule(rows[:20], batch_size=4, seed=2)


def fit_and_save(warm_start_dir, rows, ckpt_dir, callback, steps=3):
    """``steps`` steps with ``callback``, a checkpoint at the end: its path."""
    trainer = quiet_trainer(max_steps=steps, enable_checkpointing=True, callbacks=[
        callback, ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, every_n_train_steps=steps)])
    trainer.fit(make_module(warm_start_dir, seed=1), datamodule=data(rows))
    return os.path.join(str(ckpt_dir), "last.ckpt")


def test_a_checkpoint_generated_further_ahead_than_the_run_allows_is_refused(warm_start_dir, arithmetic_rows,
                                                                             tmp_path):
    """max_staleness=2 leaves three batches generated ahead in the checkpoint (versions 1..3 at
    step 3): resumed with max_staleness=1 they would train two steps stale. Refused at the restore,
    before a rollout, and the engine is closed; resumed with max_staleness=3 the lags stay within 3."""
    path = fit_and_save(warm_start_dir, arithmetic_rows, tmp_path / "ckpt", CopyRollout(max_staleness=2))
    smaller, spy = CopyRollout(max_staleness=1), Versions()
    with pytest.raises(ValueError, match=r"generated 2 batches ahead \(max_staleness=2\), this run allows 1: its "
                                         r"restored batches would train up to 2 steps stale\. Resume with max_staleness=2"):
        quiet_trainer(max_steps=6, callbacks=[smaller, spy]).fit(make_module(warm_start_dir, seed=1),
                                                                 datamodule=data(arithmetic_rows), ckpt_path=path)
    assert spy.rows == [] and smaller.engines[0].closed
    larger, spy = CopyRollout(max_staleness=3), Versions()
    quiet_trainer(max_steps=6, callbacks=[larger, spy]).fit(make_module(warm_start_dir, seed=1),
                                                            datamodule=data(arithmetic_rows), ckpt_path=path)
    assert [(v, s) for v, s, _ in spy.rows] == [(3, 1), (4, 2), (5, 3)]  # the restored batches, then on schedule


@pytest.mark.parametrize("n, between", [(3, True), (2, False)], ids=["between-syncs", "at-a-sync"])
def test_a_checkpoint_between_weight_syncs_is_said_and_one_at_a_sync_resumes_exactly(
        warm_start_dir, arithmetic_rows, tmp_path, n, between):
    """sync_every=2: after step 3 the engine holds step 2's weights, which the checkpoint does not
    keep, so the resumed run samples step 3 with step 3's (lag 0, where the straight run had 1):
    the resume warns with the fix. After step 2 the engine holds step 2's: exact, and silent."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        straight, resumed = straight_and_resumed(
            tmp_path, lambda: make_module(warm_start_dir, seed=1), lambda: data(arithmetic_rows),
            lambda: [CopyRollout(sync_every=2)], n=n)
    said = [str(w.message) for w in caught if "saved between weight syncs" in str(w.message)]
    if between:
        assert said == ["this checkpoint (step 3) was saved between weight syncs: the rollout engine held step 2's "
                        "weights, which a checkpoint does not keep. The resumed engine gets step 3's, so rollouts "
                        "until the next sync differ from an uninterrupted run's. For an exact resume with "
                        "sync_every=k, checkpoint at multiples of k (ModelCheckpoint(every_n_train_steps=k))"]
        assert straight[0][3]["async/staleness/max"] == 1.0 and resumed[0][3]["async/staleness/max"] == 0.0
    else:
        assert said == []
        assert_same_run(straight, resumed, atol=1e-6)


def test_a_refused_run_ahead_closes_the_engine_already_built(warm_start_dir, arithmetic_rows):
    """The subclass builds its engine, then `install` refuses max_staleness with a
    CurriculumSampler: the engine is closed and the module keeps the engine it had."""
    callback, module = CopyRollout(max_staleness=1), make_module(warm_start_dir)
    with pytest.raises(ValueError, match="CurriculumSampler"):
        quiet_trainer(max_steps=1, callbacks=[callback, CurriculumSampler()]).fit(
            module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert len(callback.engines) == 1 and callback.engines[0].closed and module.rollout_engine is None


def test_a_callback_reused_after_a_resume_starts_the_next_fit_afresh(warm_start_dir, arithmetic_rows, tmp_path):
    """The restored pipeline state belongs to the fit that restored it: a new fit with the same
    callback generates from batch 0, as a fresh callback does."""
    path = fit_and_save(warm_start_dir, arithmetic_rows, tmp_path / "ckpt", CopyRollout(max_staleness=1))
    callback = CopyRollout(max_staleness=1, async_seed=4)
    quiet_trainer(max_steps=6, callbacks=[callback]).fit(make_module(warm_start_dir, seed=1),
                                                         datamodule=data(arithmetic_rows), ckpt_path=path)
    runs = []
    for cb in (callback, CopyRollout(max_staleness=1, async_seed=4)):
        spy = Versions()
        quiet_trainer(max_steps=2, callbacks=[cb, spy]).fit(make_module(warm_start_dir, seed=1),
                                                            datamodule=data(arithmetic_rows))
        runs.append(spy.rows)
    assert [(v, s) for v, s, _ in runs[0]] == [(0, 0), (1, 0)] and runs[0] == runs[1]


class Forgetful(CopyEngine):
    """Copies on its schedule only, even when forced: a sync that does not land."""

    def sync_weights(self, weights, version, force=False):
        super().sync_weights(weights, version, force=False)


class ForgetfulRollout(CopyRollout):
    engine_class = Forgetful


def test_a_forced_sync_that_does_not_land_is_refused(warm_start_dir, arithmetic_rows, held_out_rows):
    """Validation after step 1 forces step 1's weights onto a sync_every=2 engine that ignores
    force: validating step 0's weights as step 1's would be silent. Refused, naming both steps."""
    trainer = quiet_trainer(max_steps=4, callbacks=[ForgetfulRollout(sync_every=2)], val_check_interval=1,
                            limit_val_batches=1)
    with pytest.raises(RuntimeError, match=r"the rollout engine Forgetful was sent step 1's weights at global step 1 "
                                           r"but holds step 0's"):
        trainer.fit(make_module(warm_start_dir), datamodule=PromptDataModule(arithmetic_rows, val_data=held_out_rows[:4],
                                                                             batch_size=4))


def test_a_rollout_staler_than_the_settings_allow_is_refused():
    """The lag (trainer's step minus the rollout's) is logged within [0, bound] and refused beyond."""
    assert staleness_metrics(5, 4, bound=1) == {"async/staleness/mean": 1.0, "async/staleness/max": 1.0}
    assert staleness_metrics(5, 5, bound=0)["async/staleness/max"] == 0.0
    with pytest.raises(RuntimeError, match=r"sampled with step 2's weights and would train at step 5, 3 steps stale; "
                                           r"sync_every and max_staleness allow 1"):
        staleness_metrics(5, 2, bound=1)
    with pytest.raises(RuntimeError, match="runs ahead"):
        staleness_metrics(5, 6, bound=1)
