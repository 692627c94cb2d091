"""The training progress bar of a real fit counts optimizer steps against ``max_steps`` (an RL
batch is a rollout trained on in several steps: Lightning's bar read "2/8" when such a run
ended, and "Epoch 0/-2"), for Lightning's two bars; a bar of the user's own is left alone."""
import io

import pytest
from lightning.pytorch.callbacks import Callback, RichProgressBar, TQDMProgressBar

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule


class BarRecorder(Callback):
    """After every batch (it runs after the bar): the bar's (position, total, title)."""

    def __init__(self):
        self.seen: list[tuple[int, int, str]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        bar = trainer.progress_bar_callback
        if isinstance(bar, RichProgressBar):
            t = bar.progress.tasks[bar.train_progress_bar_id]
            self.seen.append((int(t.completed), int(t.total), t.description.strip()))  # padded to "Validation"
        else:
            t = bar.train_progress_bar
            self.seen.append((t.n, t.total, t.desc.rstrip(": ")))


def _fit(warm_start_dir, rows, bar, **trainer_kwargs):
    # 2 prompts × 4 = 8 rows per rollout, 2 passes of mini-batches of 4: 4 optimizer steps per rollout
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0,
                      updates_per_rollout=2, minibatch_size=4, generation=dict(max_new_tokens=4, max_prompt_length=8))
    recorder = BarRecorder()
    trainer = quiet_trainer(enable_progress_bar=True, callbacks=[bar, recorder], **trainer_kwargs)
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2))
    return trainer, recorder.seen


def _rich():
    return RichProgressBar(console_kwargs=dict(file=io.StringIO(), force_terminal=True))


def _tqdm():
    return TQDMProgressBar(refresh_rate=1)


@pytest.mark.parametrize("make_bar", [_rich, _tqdm])
def test_the_bar_counts_optimizer_steps_to_max_steps(make_bar, warm_start_dir, arithmetic_rows):
    trainer, seen = _fit(warm_start_dir, arithmetic_rows[:16], make_bar(), max_steps=8)
    assert trainer.global_step == 8
    assert seen == [(4, 8, "Epoch 0"), (8, 8, "Epoch 0")]  # Lightning's: (1, 8, "Epoch 0/-2"), (2, 8, ...)


def test_with_max_epochs_only_the_bar_counts_the_epochs_rollouts(warm_start_dir, arithmetic_rows):
    _, seen = _fit(warm_start_dir, arithmetic_rows[:4], _rich(), max_epochs=1)  # 2 rollouts of 2 prompts
    assert seen == [(1, 2, "Epoch 0/0"), (2, 2, "Epoch 0/0")]


@pytest.mark.parametrize("make_bar", [_rich, _tqdm])
def test_the_bar_shows_the_rl_metrics_not_the_loggers_version(make_bar, warm_start_dir, arithmetic_rows, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    trainer, _ = _fit(warm_start_dir, arithmetic_rows[:4], make_bar(), max_steps=4,
                      logger=CSVLogger(str(tmp_path), name="run", version=0))  # Lightning draws it as v_num: 0.000
    shown = trainer.progress_bar_callback.get_metrics(trainer, trainer.lightning_module)
    assert "reward" in shown and "v_num" not in shown


class MyBar(TQDMProgressBar):
    pass


def test_a_bar_of_the_users_own_is_left_alone(warm_start_dir, arithmetic_rows):
    trainer, seen = _fit(warm_start_dir, arithmetic_rows[:4], MyBar(), max_steps=4)
    assert type(trainer.progress_bar_callback) is MyBar
    assert seen == [(1, 2, "Epoch 0")]  # Lightning's own counting: the run ends at rollout 1 of min(2, 4)
