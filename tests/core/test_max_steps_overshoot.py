"""A batch takes several optimizer steps (mini-batches × updates_per_rollout) while Lightning checks
``max_steps`` between batches only, so a ``max_steps`` that is not a multiple of them is passed:
the first such batch warns, once, with the count the run will really take."""
import warnings

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule


def fit(warm_start_dir, rows, max_steps):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, kl_coef=0.0, lr=1e-3, seed=5,
                      minibatch_size=4, generation=dict(max_new_tokens=2, max_prompt_length=8))  # 8 rows: 2 steps
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(max_steps=max_steps).fit(module, datamodule=PromptDataModule(rows, batch_size=4, seed=7))
    return module, [str(w.message) for w in caught if "optimizer steps (updates_per_rollout" in str(w.message)]


def test_a_max_steps_between_batches_warns_once_with_the_steps_the_run_takes(warm_start_dir, arithmetic_rows):
    module, messages = fit(warm_start_dir, arithmetic_rows, max_steps=5)
    assert module.policy_version == 6
    assert messages == ["each training batch takes 2 optimizer steps (updates_per_rollout × mini-batches), and "
                        "max_steps=5 is not a multiple of 2: Lightning checks max_steps between batches, so this run "
                        "will take 6 optimizer steps. Set max_steps=4 or 6 to say what you will get"]


def test_a_multiple_of_the_batch_steps_is_reached_exactly_and_silently(warm_start_dir, arithmetic_rows):
    module, messages = fit(warm_start_dir, arithmetic_rows, max_steps=4)
    assert module.policy_version == 4 and messages == []
