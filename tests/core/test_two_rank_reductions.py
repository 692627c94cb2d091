"""Review finding 5: the reductions over data-parallel ranks, on two gloo processes, where a
one-process test cannot see them: ``bnpo`` through the module's loss path (each rank divides by
its own token count, `PolicyUpdate.accumulate_gradients` passing it) gives the mean of the ranks'
token means, not the global token mean; `step_metrics.reduce_extremes` takes the min / max over
ranks, a rank without a trained sequence (±inf) is neutral, and none anywhere reads 0."""
import json
import math
import os
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WARM_START = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "arithmetic", "warm_start")
INF = math.inf
LOW, HIGH = "clip_ratio/low_min", "clip_ratio/high_max"
# case -> each rank's totals before the reduction
EXTREME_CASES = {"both": [{LOW: 0.5, HIGH: 0.25, "loss": 1.0}, {LOW: 0.25, HIGH: 0.75, "loss": 2.0}],
                 "rank 0 has no trained sequence": [{LOW: INF, HIGH: -INF}, {LOW: 0.25, HIGH: 0.5}],
                 "no rank has one": [{LOW: INF, HIGH: -INF}, {LOW: INF, HIGH: -INF}]}


def _ddp_trainer(rank: int, port: int, **kwargs):
    import lightning as L

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")
    return L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, **kwargs)


def _extremes_worker(rank: int, port: int, out: str) -> None:
    import torch

    from lightning_rlpt.stages.step_metrics import reduce_extremes

    trainer = _ddp_trainer(rank, port)
    trainer.strategy.setup_environment()
    results = {}
    for case, per_rank in EXTREME_CASES.items():
        totals = dict(per_rank[rank])
        reduce_extremes(trainer, totals)
        results[case] = totals
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    torch.distributed.destroy_process_group()


def _bnpo_worker(rank: int, port: int, out: str) -> None:
    """A one-step bnpo fit; the hook keeps 3 of rank 1's 8 rows (unequal token counts) and sets
    advantages whose per-token loss is -A exactly (μ = 1: the ratio is 1, no clipping)."""
    import sys

    import torch

    sys.path.insert(0, os.path.dirname(HERE))  # tests/: the tiny task
    import tiny_task as task
    from lightning_rlpt import PromptDataModule, RLCallback, RLModule

    class Designed(RLCallback):
        record: dict = {}

        def on_before_loss(self, trainer, module, minibatch):
            if trainer.global_rank == 1:
                minibatch = minibatch.select([0, 1, 2])
            minibatch.advantages = torch.arange(1.0, len(minibatch) + 1) * (1.0 if trainer.global_rank == 0 else -0.5)
            self.record.update(tokens=module.loss_mask(minibatch).sum(-1).tolist(),
                               advantages=minibatch.advantages.tolist())
            return minibatch

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.record["logged_loss"] = trainer.callback_metrics["loss"].item()

    module = RLModule(WARM_START, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=1e-4, seed=3,
                      loss_aggregation="bnpo", rollout_correction=None,
                      generation=dict(max_new_tokens=4, max_prompt_length=8))
    hook = Designed()
    trainer = _ddp_trainer(rank, port, max_steps=1, callbacks=[hook])
    train, _ = task.split_pairs()
    trainer.fit(module, datamodule=PromptDataModule(task.rows(train[:16]), batch_size=2, seed=7))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(hook.record, f)


def _run_two(worker, out) -> list[dict]:
    import torch.multiprocessing as mp

    from lightning_rlpt.rollout.vllm.server import free_port

    context = mp.start_processes(worker, args=(free_port(), str(out)), nprocs=2, start_method="spawn", join=False)
    deadline = time.monotonic() + 240
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two ranks did not finish (a collective one rank never joined)")
    return [json.load(open(out / f"rank{rank}.json")) for rank in (0, 1)]


@pytest.mark.slow
def test_clip_extremes_reduce_by_min_and_max_over_ranks(tmp_path):
    for totals in _run_two(_extremes_worker, tmp_path):
        assert totals["both"][LOW] == 0.25 and totals["both"][HIGH] == 0.75  # min / max over ranks
        assert totals["rank 0 has no trained sequence"] == {LOW: 0.25, HIGH: 0.5}  # ±inf is neutral
        assert totals["no rank has one"] == {LOW: 0.0, HIGH: 0.0}  # nothing clipped reads 0
    losses = [json.load(open(tmp_path / f"rank{r}.json"))["both"]["loss"] for r in (0, 1)]
    assert losses == [1.0, 2.0]  # shares are not reduced here (they are added, then averaged at logging)


@pytest.mark.slow
def test_bnpo_over_two_ranks_is_the_mean_of_their_token_means(tmp_path):
    ranks = _run_two(_bnpo_worker, tmp_path)
    sums = [sum(-a * n for a, n in zip(r["advantages"], r["tokens"])) for r in ranks]
    tokens = [sum(r["tokens"]) for r in ranks]
    assert tokens[0] != tokens[1], "the ranks must hold unequal token counts"
    bnpo = (sums[0] / tokens[0] + sums[1] / tokens[1]) / 2
    token_mean = sum(sums) / sum(tokens)
    assert abs(bnpo - token_mean) > 0.1  # the test tells the two apart
    for rank in ranks:
        assert rank["logged_loss"] == pytest.approx(bnpo, rel=1e-5, abs=1e-6)
