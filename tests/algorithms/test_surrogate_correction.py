"""`surrogate` applies the rollout correction (TIS/MIS) to the policy-gradient term, for each
mode, and leaves the KL term unweighted (as TRL and verl) unless ``correct_kl``. Weights and
losses computed by hand: on-policy ppo_clip (ratio 1) makes the policy term ``-A·w`` per token."""
import math

import pytest
import torch

from lightning_rlpt.algorithms.surrogate import surrogate
from lightning_rlpt.experience import Experience

MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]  # row 1's last column is padding
DELTA = [[0.5, -0.3, 0.2], [1.0, 0.1, 9.0]]  # log(π_old/π_behav); the padding's 9.0 must not count
ADV = [1.0, -2.0]
CAP = 1.5
E = math.exp
# Per mode, the weights by hand. Sequence log-ratios: row 0 0.4, row 1 1.1 (padding excluded).
WEIGHTS = {
    "token_tis": [[CAP, E(-0.3), E(0.2)], [CAP, E(0.1), 0.0]],        # e^0.5, e^1 truncated to 1.5
    "token_mis": [[0.0, E(-0.3), E(0.2)], [0.0, E(0.1), 0.0]],        # e^0.5, e^1 > 1.5: masked out
    "seq_tis": [[E(0.4)] * 3, [CAP, CAP, 0.0]],                       # e^1.1 truncated
    "seq_mis": [[E(0.4)] * 3, [0.0, 0.0, 0.0]],                       # e^1.1 > 1.5: the row masked out
}


def experience(ref_gap=None, behaviour=True):
    """Two rows of three completion tokens; π_old = 0 log-probs, so π_behav = -DELTA."""
    mask = torch.tensor(MASK, dtype=torch.float64)
    exp = Experience(prompt_ids=torch.zeros(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                     completion_ids=torch.zeros(2, 3, dtype=torch.long), completion_mask=mask,
                     group_ids=torch.zeros(2, dtype=torch.long), group_size=2, prompts=["p", "p"],
                     completions=["a", "b"], advantages=torch.tensor(ADV, dtype=torch.float64))
    if behaviour:
        exp.behaviour_logprobs = -torch.tensor(DELTA, dtype=torch.float64)
    if ref_gap is not None:  # logπ − logπ_ref per token
        exp.ref_logprobs = -torch.tensor(ref_gap, dtype=torch.float64)
    return exp


def per_token(exp, correction, kl_coef=0.0, correct_kl=False):
    """Per-token loss (masked) and d(Σ mask·loss)/d logπ, at logπ = π_old = 0."""
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = exp.completion_mask
    loss, _ = surrogate(exp, logp, logp.detach(), mask, policy_loss="ppo_clip", kl_estimator="k2", kl_coef=kl_coef,
                        correction=correction, correction_cap=CAP, loss_options=dict(clip_low=0.2, clip_high=0.2),
                        correct_kl=correct_kl)
    (loss * mask).sum().backward()
    return (loss * mask).detach(), logp.grad


def close(a, b):
    return torch.allclose(a, torch.as_tensor(b, dtype=torch.float64), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("mode", list(WEIGHTS))
def test_each_mode_weights_the_policy_term_by_hand(mode):
    loss, grad = per_token(experience(), mode)
    want = [[-a * w for w in row] for a, row in zip(ADV, WEIGHTS[mode])]  # value and gradient: -A·w
    assert close(loss, want) and close(grad, want)
    plain, _ = per_token(experience(), None)
    assert close(plain, [[-1.0, -1.0, -1.0], [2.0, 2.0, 0.0]])  # the weights are what changed it


def test_without_behaviour_logprobs_there_is_nothing_to_correct():
    loss, _ = per_token(experience(behaviour=False), "token_tis")
    assert close(loss, [[-1.0, -1.0, -1.0], [2.0, 2.0, 0.0]])


REF_GAP = [[0.2, -0.4, 0.6], [0.3, 0.5, 0.0]]  # δ = logπ − logπ_ref; k2 = ½δ², gradient δ
BETA = 0.1


@pytest.mark.parametrize("mode", list(WEIGHTS))
def test_the_kl_term_is_not_weighted_by_default(mode):
    """The TRL/verl choice: per token ``-A·w + β·½δ²``; the KL's gradient ``β·δ`` unweighted."""
    loss, grad = per_token(experience(REF_GAP), mode, kl_coef=BETA)
    w, m = WEIGHTS[mode], MASK
    want = [[(-a * w[i][t] + BETA * 0.5 * REF_GAP[i][t] ** 2) * m[i][t] for t in range(3)] for i, a in enumerate(ADV)]
    want_grad = [[(-a * w[i][t] + BETA * REF_GAP[i][t]) * m[i][t] for t in range(3)] for i, a in enumerate(ADV)]
    assert close(loss, want) and close(grad, want_grad)


@pytest.mark.parametrize("mode", ["token_tis", "seq_mis"])
def test_correct_kl_weights_the_kl_term_too(mode):
    """``correct_kl=True``: per token ``w·(-A + β·½δ²)``; a masked-out token loses its KL pull."""
    loss, grad = per_token(experience(REF_GAP), mode, kl_coef=BETA, correct_kl=True)
    w = WEIGHTS[mode]
    want = [[w[i][t] * (-a + BETA * 0.5 * REF_GAP[i][t] ** 2) for t in range(3)] for i, a in enumerate(ADV)]
    want_grad = [[w[i][t] * (-a + BETA * REF_GAP[i][t]) for t in range(3)] for i, a in enumerate(ADV)]
    assert close(loss, want) and close(grad, want_grad)
