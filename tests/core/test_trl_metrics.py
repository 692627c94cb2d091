"""TRL's training metrics with TRL's meanings (docs/metrics.md): ``clip_ratio/low_min`` and
``clip_ratio/high_max`` (extremes of the per-sequence clip fractions), ``num_tokens`` (running
count, checkpointed), ``learning_rate`` (the rate each update used), ``step_time`` (seconds per
optimizer step) and ``reward_std`` over the batch, read back from a real fit's CSVLogger file."""
import csv
import math

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule
from lightning_rlpt.algorithms.losses.ppo import ppo_clip_loss
from lightning_rlpt.stages.step_metrics import add_metrics, clip_extremes, reduce_extremes
from resume_utils import straight_and_resumed

PROMPT_TOKENS = 7  # "ab+cd=" and <s>


def _ratios_batch():
    """Five rows of four tokens under PPO clip 0.2: (advantage, ratios, trained-token mask)."""
    rows = [(-1.0, [0.5, 1.0, 0.5, 0.5], [1, 1, 0, 0]),   # low-clipped: 1 of 2 trained tokens
            (-1.0, [0.5, 0.5, 0.5, 1.0], [1, 1, 1, 1]),   # low 3/4
            (1.0, [1.5, 1.0, 1.0, 1.0], [1, 1, 1, 1]),    # high 1/4
            (1.0, [1.5, 1.5, 1.5, 1.0], [1, 1, 1, 0]),    # high 3/3
            (1.0, [2.0, 2.0, 2.0, 2.0], [0, 0, 0, 0])]    # no trained token: no fraction
    adv = torch.tensor([a for a, _, _ in rows])
    logp = torch.tensor([r for _, r, _ in rows]).log()
    mask = torch.tensor([m for _, _, m in rows], dtype=torch.float32)
    return logp, torch.zeros_like(logp), adv, mask


def _trl_masked_seq_extreme(x, mask, pick):
    """TRL's formula (GRPOTrainer._compute_loss): ``masked_seq_mean`` = (x·mask).sum(-1) /
    mask.sum(-1) per sequence, then ``nanmin`` / ``nanmax`` over the non-NaN ones."""
    per_seq = (x * mask).sum(-1) / mask.sum(-1)
    return pick(per_seq[~torch.isnan(per_seq)]).item()


@pytest.mark.parametrize("rows,low_min,high_max", [([0, 1], 0.5, 0.0), ([0, 1, 2, 3, 4], 0.0, 1.0),
                                                   ([2, 3, 4], 0.0, 1.0)])
def test_clip_extremes_are_min_and_max_of_per_sequence_fractions_over_trained_tokens(rows, low_min, high_max):
    logp, old, adv, mask = (t[rows] for t in _ratios_batch())
    _, stats = ppo_clip_loss(logp, old, adv, mask)
    out = clip_extremes(stats, mask)
    assert out == {"clip_ratio/low_min": pytest.approx(low_min), "clip_ratio/high_max": pytest.approx(high_max)}
    assert out["clip_ratio/low_min"] == pytest.approx(_trl_masked_seq_extreme(stats["clip_ratio/low"], mask, torch.min))
    assert out["clip_ratio/high_max"] == pytest.approx(_trl_masked_seq_extreme(stats["clip_ratio/high"], mask, torch.max))


def test_micro_batches_fold_by_sum_for_shares_and_min_max_for_extremes():
    totals = {}
    add_metrics(totals, {"loss": 1.0, "clip_ratio/low_min": 0.5, "clip_ratio/high_max": 0.25})
    add_metrics(totals, {"loss": 2.0, "clip_ratio/low_min": 0.75, "clip_ratio/high_max": 1.0})
    assert totals == {"loss": 3.0, "clip_ratio/low_min": 0.5, "clip_ratio/high_max": 1.0}
    # a micro-batch without a trained sequence is neutral; none anywhere reads 0 (nothing clipped)
    empty = clip_extremes(ppo_clip_loss(*_ratios_batch())[1], torch.zeros(5, 4))
    assert empty == {"clip_ratio/low_min": math.inf, "clip_ratio/high_max": -math.inf}
    reduce_extremes(None, empty)
    assert empty == {"clip_ratio/low_min": 0.0, "clip_ratio/high_max": 0.0}


class _Rewards(RLCallback):
    """Every rollout's summed scores (what the rollout metrics read), before any hook."""

    def __init__(self):
        self.rewards = []

    def on_rollout_scored(self, trainer, module, experience):
        self.rewards.append(experience.scores.clone())


def _rows(path):
    with open(path) as f:
        return [r for r in csv.DictReader(f) if r.get("num_tokens")]


def test_fit_logs_trl_metrics_with_trl_meanings(warm_start_dir, arithmetic_rows, tmp_path):
    """3 rollouts of 2 prompts × 4, each trained for μ=2 passes (two optimizer steps) under the
    schedule ``lr / (1 + step)``: the logged rate is the second (last) update's."""
    schedule = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))  # noqa: E731
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, updates_per_rollout=2,
                      lr_scheduler=schedule, generation=dict(max_new_tokens=4, max_prompt_length=8))
    seen = _Rewards()
    trainer = quiet_trainer(max_steps=6, logger=CSVLogger(tmp_path, name="", version=""), callbacks=[seen])
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    rows = _rows(tmp_path / "metrics.csv")
    assert len(rows) == 3
    value = lambda row, key: float(row[key])  # noqa: E731

    # num_tokens: running sum of 8 × 7 prompt tokens + 8 × the mean completion length
    step_tokens = [8 * PROMPT_TOKENS + 8 * value(r, "completions/mean_length") for r in rows]
    assert [value(r, "num_tokens") for r in rows] == pytest.approx([sum(step_tokens[:i + 1]) for i in range(3)])
    assert module.tokens_seen == pytest.approx(sum(step_tokens))
    # learning_rate: rollout t's updates are optimizer steps 2t and 2t+1; the last used lr / (2t + 2)
    assert [value(r, "learning_rate") for r in rows] == pytest.approx([1e-3 / 2, 1e-3 / 4, 1e-3 / 6], rel=1e-6)
    for row, tokens in zip(rows, step_tokens):
        # step_time × 2 optimizer steps is the step's wall time, which tokens_per_s divides into
        assert value(row, "step_time") * 2 * value(row, "throughput/tokens_per_s") == pytest.approx(tokens, rel=1e-5)
        stages = sum(float(v) for k, v in row.items() if k.startswith("timing/") and v)
        assert value(row, "step_time") * 2 >= stages
        assert value(row, "clip_ratio/low_min") <= value(row, "clip_ratio/low_mean")
        assert value(row, "clip_ratio/high_max") >= value(row, "clip_ratio/high_mean")
        assert value(row, "completions/min_terminated_length") >= value(row, "completions/min_length")
    # reward_std: the unbiased std of each rollout's 8 rewards (TRL), not the mean of group stds
    assert [value(r, "reward_std") for r in rows] == pytest.approx([r.std().item() for r in seen.rewards], abs=1e-6)
    groups = [r.view(-1, 4).std(1).mean().item() for r in seen.rewards]
    assert [value(r, "reward_group_std") for r in rows] == pytest.approx(groups, abs=1e-6)


class _DesignedRatios(RLCallback):
    """Sets each mini-batch's old log-probs so that π/π_old is 0.5 (rollout 1, advantages -1:
    low-clipped) or 1.5 (rollout 2, advantages +1: high-clipped) on each row's first trained token
    and 1 elsewhere (row 0: on all its trained tokens), and records what TRL's formulas give."""

    def __init__(self):
        self.expected = []

    def on_before_loss(self, trainer, module, minibatch):
        low = not self.expected
        with torch.no_grad():
            logp = module._logprobs(module.policy, minibatch)[0].float()
        mask = module.loss_mask(minibatch)
        chosen = ((mask.cumsum(-1) == 1) & (mask > 0)).float()
        chosen[0] = mask[0]
        minibatch.advantages = torch.full((len(minibatch),), -1.0 if low else 1.0)
        minibatch.old_logprobs = logp - math.log(0.5 if low else 1.5) * chosen
        per_seq = chosen.sum(-1) / mask.sum(-1)  # NaN for a row without a trained token, which TRL skips
        clipped = per_seq[~per_seq.isnan()]
        self.expected.append({"low": low, "extreme": (clipped.min() if low else clipped.max()).item(),
                              "mean": (chosen.sum() / mask.sum()).item()})
        return minibatch


def test_clip_extremes_are_exact_on_a_fit_that_clips(warm_start_dir, arithmetic_rows, tmp_path):
    """Through the module's path (micro-batches folded by min / max, then the rank reduction):
    rollout 1 low-clips every row (low_min = the smallest 1 / trained tokens), rollout 2
    high-clips row 0 entirely (high_max = 1) and nothing low (low_min = 0)."""
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-4, kl_coef=0.0,
                      micro_batch_size=3, generation=dict(max_new_tokens=4, max_prompt_length=8))
    designed = _DesignedRatios()
    trainer = quiet_trainer(max_steps=2, logger=CSVLogger(tmp_path, name="", version=""), callbacks=[designed])
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    rows = _rows(tmp_path / "metrics.csv")
    assert len(rows) == len(designed.expected) == 2
    (low_row, high_row), (low, high) = rows, designed.expected
    assert 0 < low["extreme"] < 1 and high["extreme"] == 1.0
    assert float(low_row["clip_ratio/low_min"]) == pytest.approx(low["extreme"], abs=1e-6)
    assert float(low_row["clip_ratio/low_mean"]) == pytest.approx(low["mean"], abs=1e-6)
    assert float(low_row["clip_ratio/high_max"]) == 0.0
    assert float(high_row["clip_ratio/high_max"]) == pytest.approx(1.0, abs=1e-6)
    assert float(high_row["clip_ratio/high_mean"]) == pytest.approx(high["mean"], abs=1e-6)
    assert float(high_row["clip_ratio/low_min"]) == 0.0


def test_num_tokens_continues_across_a_resume(warm_start_dir, arithmetic_rows, tmp_path):
    def make_module():
        return RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4,
                        generation=dict(max_new_tokens=4, max_prompt_length=8))

    (straight, _), (resumed, _) = straight_and_resumed(
        tmp_path, make_module, lambda: PromptDataModule(arithmetic_rows, batch_size=2), n=1)
    tokens = [straight[s]["num_tokens"] for s in sorted(straight)]
    assert tokens[1] > tokens[0] > 0
    assert [resumed[s]["num_tokens"] for s in sorted(resumed)] == tokens


def test_clip_extremes_of_one_decision_per_sequence_are_every_rows():
    """GSPO's clip decisions are one per sequence ([N]); TRL's masked_seq_mean takes them as they are,
    so low_min / high_max are their min / max (they were left out before)."""
    stats = {"clip_ratio/low": torch.tensor([0.0, 1.0, 1.0]), "clip_ratio/high": torch.tensor([0.0, 0.0, 1.0])}
    assert clip_extremes(stats, torch.ones(3, 4)) == {"clip_ratio/low_min": 0.0, "clip_ratio/high_max": 1.0}
