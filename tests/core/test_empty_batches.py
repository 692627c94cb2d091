"""An empty batch (every row removed by a hook) skips its step, so ``max_steps`` comes no nearer.
A run whose every batch is emptied used to loop over epochs forever; now a whole epoch of empty
batches in a row, but at least 100 (in a short epoch a few can be chance), stops it with the
cause, and a run that empties only some batches still trains."""
import pytest

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule


class Empties(RLCallback):
    """Removes every row of the batches ``which(n)`` picks (n counts the batches)."""

    def __init__(self, which):
        self.which, self.batches = which, 0

    def on_rewards_computed(self, trainer, module, experience):
        self.batches += 1
        return experience.select([]) if self.which(self.batches) else experience


def fit(warm_start_dir, rows, hook, steps):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, kl_coef=0.0, lr=1e-3, seed=5,
                      generation=dict(max_new_tokens=2, max_prompt_length=8))
    quiet_trainer(max_steps=steps, callbacks=[hook]).fit(module, datamodule=PromptDataModule(rows, batch_size=4, seed=7))
    return module


def test_a_hundred_empty_batches_in_a_row_stop_the_run_naming_the_cause(warm_start_dir, arithmetic_rows):
    hook = Empties(lambda n: True)
    with pytest.raises(RuntimeError, match=r"the last 100 training batches in a row were all empty after the "
                                           r"RL hooks, so no optimizer step was taken since global step 0 .* "
                                           r"max_steps would never be reached"):
        fit(warm_start_dir, arithmetic_rows[:12], hook, steps=2)
    assert hook.batches == 100  # 34 epochs of 3 batches (a whole epoch is fewer than 100), not an endless loop


def test_in_a_one_batch_epoch_an_empty_batch_is_not_the_end(warm_start_dir, arithmetic_rows):
    """One batch an epoch: its first rollout emptied (dynamic filtering early on) is chance, not a
    run that can never step; the next epoch trains."""
    hook = Empties(lambda n: n == 1)
    module = fit(warm_start_dir, arithmetic_rows[:4], hook, steps=2)
    assert module.policy_version == 2 and hook.batches == 3


def test_some_empty_batches_skip_their_steps_and_the_run_still_ends(warm_start_dir, arithmetic_rows):
    hook = Empties(lambda n: n % 3 != 0)  # two empty batches in a row, then one that trains: never a whole epoch
    module = fit(warm_start_dir, arithmetic_rows[:12], hook, steps=2)
    assert module.policy_version == 2 and hook.batches == 6
