"""A run whose groups carry no learning signal (every completion of a group scores the same) is
told so once, after ``STEPS`` rollouts in a row, with what to try; a run with signal is not."""
import warnings

import pytest

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.stages.learning_signal import STEPS, NoSignalWatch


def fit(warm_start_dir, rows, reward, steps):
    module = RLModule(warm_start_dir, reward_funcs=[reward], group_size=4, lr=1e-3, seed=5,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_trainer(max_steps=steps).fit(module, datamodule=PromptDataModule(rows, batch_size=2, seed=7))
    return [str(w.message) for w in seen if "identical rewards" in str(w.message)]


def test_a_flat_reward_warns_once_with_what_to_try(warm_start_dir, arithmetic_rows):
    def never(completions, **_):  # an untrained model on a hard task: every completion scores 0
        return [0.0] * len(completions)

    said = fit(warm_start_dir, arithmetic_rows, never, STEPS + 3)
    assert len(said) == 1
    assert (f"for the last {STEPS} training rollouts at least 90% of the groups had identical rewards "
            "(frac_reward_zero_std 1.00, mean reward 0)") in said[0]
    assert "too hard for this model" in said[0] and "group_size (now 4)" in said[0]


def test_a_reward_with_signal_does_not_warn(warm_start_dir, arithmetic_rows):
    def spread(completions, **_):  # differs within every group
        return [float(i % 4) for i in range(len(completions))]

    assert fit(warm_start_dir, arithmetic_rows, spread, STEPS + 3) == []


@pytest.mark.parametrize("shares, warns_at", [
    ([1.0] * 10, 10),                   # ten in a row
    ([1.0] * 9 + [0.5] + [1.0] * 9, None),  # a rollout with signal starts the count again
    ([0.9] * 12, 10),                   # at the share itself
    ([0.89] * 12, None),
])
def test_the_count_is_of_rollouts_in_a_row(shares, warns_at):
    watch = NoSignalWatch()
    said = [i + 1 for i, share in enumerate(shares) if watch.see(share, 0.0, 4)]
    assert said == ([] if warns_at is None else [warns_at])
