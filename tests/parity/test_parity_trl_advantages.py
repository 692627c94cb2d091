"""TRL 1.16's reward→advantage block (``GRPOTrainer._generate_and_score_completions``, run from its
installed source: tests/parity/parity_trl.py) against this project's path: `RewardFunctions.aggregate`
then `compute_advantages` with the estimator `from_grpo_config` picks. Every ``scale_rewards``,
both multi-objective aggregations, weights, and functions that return None for some samples."""
import math

import pytest
import torch

from lightning_rlpt.algorithms.advantages import compute_advantages
from lightning_rlpt.compat.trl import from_grpo_config
from lightning_rlpt.rewards.functions import RewardError, RewardFunctions
from parity_record import compare
from parity_trl import advantages as trl_advantages, trl_config

NAN = math.nan


def scores(seed, rows=12, functions=2, none_rate=0.0, ties=False):
    """``[rows, functions]`` float64 scores, some None (NaN) but never a whole row; ``ties``: 0/1 scores
    with one group all equal (zero std)."""
    g = torch.Generator().manual_seed(seed)
    out = (torch.rand(rows, functions, generator=g, dtype=torch.float64) > 0.5).double() if ties else \
        torch.randn(rows, functions, generator=g, dtype=torch.float64)
    if ties:
        out[:4] = 1.0
    drop = torch.rand(rows, functions, generator=g) < none_rate
    drop[:, 0] &= drop[:, 1:].sum(-1) < functions - 1  # every row keeps at least one score
    return out.masked_fill(drop, NAN)


def ours(fields, rewards_per_func):
    module = from_grpo_config(fields).module
    fns = [lambda prompts, completions, **_: [0.0] * len(completions) for _ in range(rewards_per_func.shape[1])]
    rewards = RewardFunctions(fns, module.get("reward_weights"),
                              aggregation=module["multi_objective_aggregation"]).aggregate(rewards_per_func,
                                                                                           module["group_size"])
    return compute_advantages(module["advantage"], rewards, module["group_size"], **module["advantage_kwargs"])


SETTINGS = {
    "scale_rewards group (default)": ({}, {}),
    "scale_rewards batch": (dict(scale_rewards="batch"), {}),
    "scale_rewards none (Dr. GRPO)": (dict(scale_rewards="none"), {}),
    "scale_rewards True / False": (dict(scale_rewards=False), {}),
    "zero-std groups (0/1 rewards)": ({}, dict(ties=True)),
    "zero-std groups, batch": (dict(scale_rewards="batch"), dict(ties=True)),
    "three weighted functions": (dict(reward_weights=[1.0, 0.5, 2.0]), dict(functions=3)),
    "weighted functions, some None": (dict(reward_weights=[1.0, 0.5, 2.0]), dict(functions=3, none_rate=0.3)),
    "some None, scale_rewards batch": (dict(scale_rewards="batch"), dict(none_rate=0.3)),
    "normalize_then_sum (GDPO)": (dict(multi_objective_aggregation="normalize_then_sum"), dict(functions=3)),
    "normalize_then_sum, weighted": (dict(multi_objective_aggregation="normalize_then_sum",
                                          reward_weights=[2.0, 1.0, 0.5]), dict(functions=3)),
    "normalize_then_sum, some None": (dict(multi_objective_aggregation="normalize_then_sum"),
                                      dict(functions=3, none_rate=0.3)),
    "groups of 6": (dict(num_generations=6, per_device_train_batch_size=12), {}),
}


@pytest.mark.parametrize("name", SETTINGS)
def test_advantages_equal_trls(name):
    fields, options = SETTINGS[name]
    fields = {"num_generations": 4, **fields}
    rewards_per_func = scores(len(name), **options)
    theirs = trl_advantages(trl_config(**fields), rewards_per_func)
    compare(name, "TRL 1.16", {"advantages": (ours(fields, rewards_per_func), theirs)})


def test_a_row_every_function_returned_none_for_is_refused_where_trl_gives_it_advantage_0():
    """The decision (docs/from_trl.md, "Meanings that differ"): TRL 1.16 leaves the row out of its
    group's mean and std and gives it advantage 0; here it is an error that names the sample."""
    rewards_per_func = scores(7)
    rewards_per_func[2] = NAN
    theirs = trl_advantages(trl_config(num_generations=4), rewards_per_func)
    assert theirs[2].item() == 0.0 and torch.isfinite(theirs).all()
    fns = [lambda prompts, completions, **_: [None] * len(completions)] * 2
    with pytest.raises(RewardError, match="every reward function .* returned None for sample 0"):
        RewardFunctions(fns)(["p"] * 4, ["c"] * 4, {})
