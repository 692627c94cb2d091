"""``grpo_batch_std`` (TRL's ``scale_rewards="batch"``): the group mean over the std of the whole
batch, by hand in one process and over two gloo processes (every rank's rewards), and the same
values as TRL's formula.

TRL's formula is transcribed from ``trl/trainer/grpo_trainer.py`` (TRL main, July 2026),
``GRPOTrainer._generate_and_score_completions`` (``multi_objective_aggregation=
"sum_then_normalize"``, the ``scale_rewards == "batch"`` branch) and ``trl/trainer/utils.py``
``nanstd``.
"""
import json
import math
import os

import pytest
import torch

from lightning_rlpt.algorithms.advantages import check_estimator, compute_advantages
from trl_formulas import nanstd

# Two ranks' rewards, G = 2: rank 0 holds groups (1, 0), (.5, .5); rank 1 (0, 0), (1, 0).
RANK_REWARDS = [[1.0, 0.0, 0.5, 0.5], [0.0, 0.0, 1.0, 0.0]]
# All eight: mean 3/8, Σ(r − 3/8)² = 2·(5/8)² + 4·(3/8)² + 2·(1/8)² = 11/8; unbiased std √(11/56).
GLOBAL_STD = math.sqrt(11 / 56)
EXPECTED = [[0.5 / GLOBAL_STD, -0.5 / GLOBAL_STD, 0.0, 0.0], [0.0, 0.0, 0.5 / GLOBAL_STD, -0.5 / GLOBAL_STD]]


def test_by_hand_one_process():
    rewards = torch.tensor(RANK_REWARDS[0] + RANK_REWARDS[1], dtype=torch.float64)
    adv = compute_advantages("grpo_batch_std", rewards, 2, eps=0.0)
    assert adv.tolist() == pytest.approx(EXPECTED[0] + EXPECTED[1], abs=1e-12)
    population = compute_advantages("grpo_batch_std", rewards, 2, eps=0.0, std_unbiased=False)
    assert population[0].item() == pytest.approx(0.5 / math.sqrt(11 / 64))


def trl_batch_scaled(rewards, num_generations):
    """TRL's advantages at ``scale_rewards="batch"`` (no NaN rewards)."""
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    return advantages / (std_rewards + 1e-4)


def test_equals_trl():
    """To 1e-7: TRL's Bessel factor ``count / (count - 1)`` divides integer tensors, so it is float32."""
    rewards = torch.rand(6 * 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rewards[4:8] = 0.25  # a group whose rewards agree: 0 here as in TRL
    ours = compute_advantages("grpo_batch_std", rewards, 4, eps=1e-4)
    assert torch.allclose(ours, trl_batch_scaled(rewards, 4), rtol=0.0, atol=1e-7)
    assert ours[4:8].abs().max().item() == 0.0


def test_sum_over_ranks_is_the_modules_not_an_advantage_kwarg():
    with pytest.raises(ValueError, match=r"advantage_kwargs\['sum_over_ranks'\]: the module passes"):
        check_estimator("grpo_batch_std", 4, {"sum_over_ranks": sum})
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        check_estimator("grpo_batch_std", 1)


def _two_ranks_worker(rank: int, port: int, out: str) -> None:
    """One rank of a CPU DDP Trainer (its process group set up, as in fit): the module's call."""
    from functools import partial

    import lightning as L

    from lightning_rlpt.model.distributed import reduce_over_ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    trainer.strategy.setup_environment()
    rewards = torch.tensor(RANK_REWARDS[rank])
    both = compute_advantages("grpo_batch_std", rewards, 2, sum_over_ranks=partial(reduce_over_ranks, trainer), eps=0.0)
    alone = compute_advantages("grpo_batch_std", rewards, 2, eps=0.0)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"both": both.tolist(), "alone": alone.tolist()}, f)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_processes_use_the_std_of_every_ranks_rewards(tmp_path):
    """Each rank holds two groups; both divide by √(11/56), the std of all eight rewards, not
    their own four's (rank 0: √(1/6), rank 1: √(3/16))."""
    import torch.multiprocessing as mp
    from lightning_rlpt.rollout.vllm.server import free_port

    mp.start_processes(_two_ranks_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    for rank in (0, 1):
        result = json.load(open(tmp_path / f"rank{rank}.json"))
        assert result["both"] == pytest.approx(EXPECTED[rank], rel=1e-6)
    local = json.load(open(tmp_path / "rank0.json"))["alone"]
    assert local[0] == pytest.approx(0.5 / math.sqrt(1 / 6), rel=1e-6)  # the rank-local std differs


@pytest.mark.slow
def test_ddp_fit_trains_like_one_process_holding_both_ranks_prompts(tmp_path):
    """The module passes its ranks' sum: two DDP processes (two prompts each) log the gradient norm
    of one process holding all four prompts, which a rank-local std would change."""
    from model.test_distributed import _run  # tests/scripts/distributed_fit.py, its logged rows

    flag = ("--advantage", "grpo_batch_std")
    (single, _), (ddp, _) = _run("single", tmp_path / "single", *flag), _run("ddp", tmp_path / "ddp", *flag)
    assert len(single) == len(ddp) == 3
    for step, (a, b) in enumerate(zip(single, ddp)):
        for key in ("grad_norm", "reward"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), f"step {step} {key}: {a[key]} vs {b[key]}"
