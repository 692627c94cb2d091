"""Callbacks measure the tokens the loss trains on (issue 23, item 5).

With ``mask_truncated_completions=True`` the loss leaves a truncated row out
(``module.loss_mask`` = `Experience.trained_mask`); every callback's statistic must then equal the
value computed by hand over the trained tokens only. Each test builds one group of four rows by
hand (row 2 truncated, with values that move every statistic if it were counted) and runs the
callback's hook on the demo's real warm start."""
import math
from types import SimpleNamespace

import pytest
import torch

from callback_helpers import make_module
from lightning_rlpt import Experience
from lightning_rlpt.algorithms.advantages import compute_advantages, estimator_fields
from lightning_rlpt.callbacks import BAPO, EntropyGatedKL, ESSScaledLR, ResponseWeightedKL

LENGTHS = [4, 3, 4, 2]  # completion tokens per row; row 2 hit max_new_tokens without EOS
TRUNCATED = 2
TRAINED = [i for i in range(4) if i != TRUNCATED]
ONE_RANK = SimpleNamespace(world_size=1)


@pytest.fixture(scope="module")
def module(warm_start_dir):
    return make_module(warm_start_dir, mask_truncated_completions=True)


def experience() -> Experience:
    g = torch.Generator().manual_seed(0)
    completion_mask = torch.stack([torch.arange(4) < n for n in LENGTHS]).float()
    return Experience(prompt_ids=torch.randint(3, 15, (4, 3), generator=g), prompt_mask=torch.ones(4, 3, dtype=torch.long),
                      completion_ids=torch.randint(3, 15, (4, 4), generator=g), completion_mask=completion_mask,
                      group_ids=torch.zeros(4, dtype=torch.long), group_size=4, prompts=["p"] * 4,
                      completions=["c"] * 4, truncated=torch.tensor([False, False, True, False]),
                      scores=torch.tensor([1.0, 0.0, 1.0, 0.0]), rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
                      advantages=torch.tensor([1.0, -0.5, -3.0, 0.5]))


def trained_tokens(exp: Experience) -> list[tuple[int, int]]:
    return [(i, t) for i in TRAINED for t in range(LENGTHS[i])]


def test_the_loss_and_the_callbacks_share_one_mask(module):
    exp = experience()
    expected = exp.completion_mask.clone()
    expected[TRUNCATED] = 0
    assert torch.equal(module.loss_mask(exp), expected) and torch.equal(exp.trained_mask(True), expected)
    assert torch.equal(exp.trained_mask(False), exp.completion_mask)
    exp.truncated = None
    with pytest.raises(ValueError, match="mask_truncated_completions needs experience.truncated"):
        module.loss_mask(exp)


def test_bapo_balances_the_trained_tokens_only(module):
    exp = experience()
    with torch.no_grad():
        logp, _ = module.policy_logprobs(exp)
    ratio = torch.tensor([1.1, 0.9, 0.95, 1.05]).unsqueeze(-1).expand(4, 4)
    exp.old_logprobs = logp.float() - ratio.log()  # π/π_old = ratio exactly
    bapo = BAPO(low_bounds=(0.6, 0.6), high_bounds=(1.2, 1.2))  # one candidate: the ratio at (0.6, 1.2)
    bapo.on_before_loss(ONE_RANK, module, exp)
    pos = sum(float(ratio[i, t]) * exp.advantages[i].item() for i, t in trained_tokens(exp) if exp.advantages[i] > 0)
    neg = sum(float(ratio[i, t]) * -exp.advantages[i].item() for i, t in trained_tokens(exp) if exp.advantages[i] < 0)
    assert bapo.pos_neg_ratio == pytest.approx(pos / (neg + 1e-8), rel=1e-5)  # row 2 (A = -3) would triple neg


def test_ess_counts_the_trained_sequences_only(module):
    exp = experience()
    exp.old_logprobs = torch.zeros(4, 4)
    exp.behaviour_logprobs = -torch.tensor([0.3, -0.2, 2.0, 0.1]).unsqueeze(-1).expand(4, 4).contiguous()
    ess = ESSScaledLR(rule="linear")
    ess.on_before_loss(ONE_RANK, module, exp)
    w = [math.exp(sum(-exp.behaviour_logprobs[i, t].item() for t in range(LENGTHS[i]))) for i in TRAINED]
    rho = sum(w) ** 2 / (sum(x * x for x in w) + 1e-8) / len(w)
    assert rho < 1 and ess._factor == pytest.approx(rho, rel=1e-9)  # linear rule: the LR factor is ρ itself
    # The min-variance baseline A = R − Σ W R / Σ W, W = w² (grad_norm_proxy "none"), over the trained rows:
    # now the estimator's, fed by the module (`estimator_fields` with its loss mask), no longer ESSScaledLR's.
    name = "min_variance_offpolicy"
    exp.advantages = compute_advantages(name, exp.rewards, 4, **estimator_fields(name, exp, module.loss_mask))
    baseline = sum(x * x * exp.rewards[i].item() for x, i in zip(w, TRAINED)) / (sum(x * x for x in w) + 1e-8)
    got = exp.advantages[TRAINED].tolist()
    assert got == pytest.approx([exp.rewards[i].item() - baseline for i in TRAINED], rel=1e-5)


def test_entropy_gated_kl_measures_kl_and_entropy_on_the_trained_tokens(module):
    exp = experience()
    with torch.no_grad():
        logp, entropy = module.policy_logprobs(exp, with_entropy=True)
    exp.ref_logprobs = logp.float() - torch.tensor([0.1, 0.2, 5.0, 0.3]).unsqueeze(-1)
    safe = EntropyGatedKL(base_kl_coef=0.0)
    seen = []
    original = safe.observe
    safe.observe = lambda reward, kl, ent: seen.append((reward, kl, ent)) or original(reward, kl, ent)
    safe.on_advantages_computed(ONE_RANK, module, exp)
    tokens = trained_tokens(exp)
    kl = sum(float(logp[i, t] - exp.ref_logprobs[i, t]) for i, t in tokens) / len(tokens)
    ent = sum(float(entropy[i, t]) for i, t in tokens) / len(tokens)
    assert len(seen) == 1
    reward, got_kl, got_ent = seen[0]
    assert reward == pytest.approx(0.5) and got_kl == pytest.approx(kl, rel=1e-5) and got_ent == pytest.approx(ent, rel=1e-5)


def test_response_weighted_kl_takes_entropies_and_the_group_range_over_trained_rows(module):
    exp = experience()
    entropy = torch.tensor([[1.0, 1.2, 1.4, 9.0], [0.5, 0.7, 0.9, 9.0], [8.0, 8.0, 8.0, 8.0], [2.0, 3.0, 9.0, 9.0]])
    exp.info["ref_entropy"] = entropy  # tokens past a row's length (9.0) and row 2 (8.0) are not trained on
    rer = ResponseWeightedKL()
    rer.on_advantages_computed(ONE_RANK, module, exp)
    h = {i: sum(entropy[i, t].item() for t in range(LENGTHS[i])) / LENGTHS[i] for i in TRAINED}
    lo, hi = min(h.values()), max(h.values())
    expected = []
    for i in range(4):
        a = exp.advantages[i].item()
        if i == TRUNCATED:
            beta = 0.10  # not trained on: b_base, weight 1
        else:
            x = (h[i] - lo) / (hi - lo + 1e-6)
            beta = 0.05 + 0.05 * (1 - x) if a > 0 else 0.10 + 0.02 * x if a < 0 else 0.10
        expected.append(beta / 0.10)
    assert exp.kl_weights.tolist() == pytest.approx(expected, rel=1e-5)
