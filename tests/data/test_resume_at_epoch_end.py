"""A checkpoint taken right after an epoch's last batch resumes in the next epoch with that
epoch's batches, as an uninterrupted run does. Before, the loader skipped the finished epoch's
batch count again in the next epoch, so a resumed run silently trained on the epoch after it."""
import tiny_task as task
from lightning_rlpt import PromptDataModule, RLCallback, RLModule
from resume_utils import assert_same_run, straight_and_resumed

ROWS = 12  # 3 batches of 4 per epoch: a checkpoint every 3 steps lands on each epoch's end


class Batches(RLCallback):
    """(global step, epoch, prompt indices) of every training batch."""

    def __init__(self, seen):
        self.seen = seen

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append((trainer.global_step, trainer.current_epoch, list(batch["index"])))


def resume_run(warm_start_dir, arithmetic_rows, tmp_path, seen, **kwargs):
    """`straight_and_resumed` of a tiny run whose batches ``seen`` records."""
    return straight_and_resumed(
        tmp_path,
        lambda: RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, lr=1e-3, seed=5,
                         kl_coef=0.0, generation=dict(max_new_tokens=3, max_prompt_length=8)),
        lambda: PromptDataModule(arithmetic_rows[:ROWS], batch_size=4, seed=7),
        lambda: [Batches(seen)], **kwargs)


def test_a_checkpoint_at_an_epoch_end_resumes_into_the_next_epoch(warm_start_dir, arithmetic_rows, tmp_path):
    seen = []
    straight, resumed = resume_run(warm_start_dir, arithmetic_rows, tmp_path, seen, n=3)
    straight_batches, resumed_batches = seen[:6], seen[6:9] + seen[9:]
    assert [epoch for _, epoch, _ in straight_batches] == [0, 0, 0, 1, 1, 1]
    assert resumed_batches == straight_batches  # step 3 onward: epoch 1's batches, not epoch 2's
    assert_same_run(straight, resumed)


def test_a_checkpoint_at_the_batch_limit_resumes_into_the_next_epoch(warm_start_dir, arithmetic_rows, tmp_path):
    """limit_train_batches=2 of 3: the epoch ends after 2 batches, short of the loader's length, so
    only the recorded epoch tells the loader the resumed iteration is a new one."""
    seen = []
    straight, resumed = resume_run(warm_start_dir, arithmetic_rows, tmp_path, seen, n=2, limit_train_batches=2)
    assert [epoch for _, epoch, _ in seen[:4]] == [0, 0, 1, 1]
    assert seen[4:] == seen[:4]
    assert_same_run(straight, resumed)


def test_a_loader_restored_with_its_whole_epoch_consumed_yields_the_next_epoch_whole(arithmetic_rows):
    data = PromptDataModule(arithmetic_rows[:ROWS], batch_size=4, seed=7)
    data.setup("fit")
    loader = data.train_dataloader()
    assert len(loader) == 3
    loader.load_state_dict({"consumed": 3})
    loader.sampler.set_epoch(1)
    assert len(list(loader)) == 3
    loader.load_state_dict({"consumed": 2})  # mid-epoch: the rest of it
    assert len(list(loader)) == 1
    loader.load_state_dict({"consumed": 2, "epoch": 0})  # recorded in epoch 0, iterated in epoch 1: all of it
    assert len(list(loader)) == 3
    loader.load_state_dict({"consumed": 2, "epoch": 1})  # the same epoch: the rest of it
    assert len(list(loader)) == 1 and loader.state_dict() == {"consumed": 3, "epoch": 1}
