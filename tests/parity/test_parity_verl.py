"""verl 0.9.1's own core_algos (tests/parity/parity_verl.py) against this project's estimators,
policy losses, KL estimators and aggregation modes on the same float64 tensors, verl's edge cases
included (zero std, groups of one). A setting where the two differ by design is asserted to still
differ and recorded with the reason (`differs`): the table in docs/from_trl.md shows it."""
import pytest
import torch

from lightning_rlpt.algorithms.advantages import compute_advantages
from lightning_rlpt.algorithms.aggregation import aggregate_loss
from lightning_rlpt.algorithms.kl import KL_ESTIMATORS
from lightning_rlpt.algorithms.losses import POLICY_LOSSES
from parity_ours import parity_batch
from parity_record import compare, differs
from parity_verl import advantages as verl_advantages, kl as verl_kl, policy_loss as verl_policy_loss

PEER = "verl 0.9.1"
G = 3


def scores(seed, rows=12, ties=False):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(rows, generator=g, dtype=torch.float64)
    if ties:
        out[:G] = 1.0  # a group whose rewards are all equal: zero std
    return out


def mask_for(rows, cols=5, ragged=True):
    mask = torch.ones(rows, cols, dtype=torch.float64)
    if ragged:
        mask[1, 2:], mask[5, 4:] = 0, 0
    return mask


# name: (verl estimator, its options, ours, our options, scores options, ragged lengths)
ADVANTAGES = {
    "GRPO": ("grpo", {}, "grpo", {}, {}, True),
    "GRPO, a zero-std group": ("grpo", {}, "grpo", {}, dict(ties=True), True),
    "Dr. GRPO (no std)": ("grpo", dict(norm_adv_by_std_in_grpo=False), "dr_grpo", {}, {}, True),
    "RLOO": ("rloo", {}, "rloo", {}, {}, True),
}


@pytest.mark.parametrize("name", ADVANTAGES)
def test_advantages_equal_verls(name):
    theirs_name, theirs_options, ours_name, ours_options, score_options, ragged = ADVANTAGES[name]
    r = scores(len(name), **score_options)
    mask = mask_for(len(r), ragged=ragged)
    theirs = verl_advantages(theirs_name, r, mask, torch.arange(len(r)) // G, **theirs_options)
    ours = compute_advantages(ours_name, r, G, **ours_options).unsqueeze(-1) * mask
    compare(f"advantage: {name}", PEER, {"advantages": (ours, theirs)})


@pytest.mark.parametrize("baseline", [False, True])
def test_reinforce_pp_whitens_sequences_where_verl_whitens_tokens(baseline):
    """verl whitens the token-level returns (each row weighs its length, Bessel over tokens); here
    the batch statistics are over sequences, one advantage per row (REINFORCE++'s outcome form)."""
    r = scores(3)
    mask = mask_for(len(r))
    theirs = verl_advantages("reinforce_plus_plus_baseline" if baseline else "reinforce_plus_plus", r, mask,
                             torch.arange(len(r)) // G)
    ours = compute_advantages("reinforce_pp", r, G, group_baseline=baseline).unsqueeze(-1) * mask
    differs(f"advantage: REINFORCE++{'-baseline' if baseline else ''}", PEER, {"advantages": (ours, theirs)},
            "verl whitens token-level returns (a row weighs its length); here one advantage per sequence, "
            "whitened over sequences")


def test_groups_of_one_are_refused_where_verl_keeps_the_raw_score():
    """verl gives a one-completion group mean 0 and std 1 (the advantage is the score); a group
    estimator here refuses group_size 1 at construction, saying why."""
    r = scores(5, rows=4)
    theirs = verl_advantages("grpo", r, mask_for(4, ragged=False), torch.arange(4))
    assert torch.allclose(theirs[:, 0], r / (1 + 1e-6))
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        from lightning_rlpt.algorithms.advantages.base import check_estimator
        check_estimator("grpo", 1)


# name: (verl loss, its ActorConfig fields, ours, our options, aggregation)
LOSSES = {
    "PPO clip, dual clip 3, token-mean": ("vanilla", dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28,
                                                          clip_ratio_c=3.0), "ppo_clip",
                                          dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0), "token-mean"),
    "PPO clip, dual clip 3, seq-mean-token-mean": ("vanilla", dict(clip_ratio=0.2, clip_ratio_c=3.0), "ppo_clip",
                                                   dict(clip_low=0.2, clip_high=0.2, dual_clip=3.0),
                                                   "seq-mean-token-mean"),
    "PPO clip, dual clip 3, seq-mean-token-sum": ("vanilla", dict(clip_ratio=0.2, clip_ratio_c=3.0), "ppo_clip",
                                                  dict(clip_low=0.2, clip_high=0.2, dual_clip=3.0),
                                                  "seq-mean-token-sum"),
    "PPO clip, dual clip 3, seq-mean-token-sum-norm": ("vanilla", dict(clip_ratio=0.2, clip_ratio_c=3.0), "ppo_clip",
                                                       dict(clip_low=0.2, clip_high=0.2, dual_clip=3.0),
                                                       "seq-mean-token-sum-norm"),
    "GSPO, seq-mean-token-mean": ("gspo", dict(clip_ratio_low=3e-4, clip_ratio_high=4e-4), "gspo",
                                  dict(clip_low=3e-4, clip_high=4e-4), "seq-mean-token-mean"),
    "GSPO, wide clip": ("gspo", dict(clip_ratio_low=0.2, clip_ratio_high=0.2), "gspo",
                        dict(clip_low=0.2, clip_high=0.2), "seq-mean-token-mean"),
    "CISPO (two-sided), token-mean": ("cispo", dict(clip_ratio_low=0.2, clip_ratio_high=0.28), "cispo",
                                      dict(clip_low=0.2, clip_high=0.28, clip_lower=True), "token-mean"),
    "SAPO, τ 1 / 1.05": ("sapo", dict(tau_pos=1.0, tau_neg=1.05), "sapo",
                         dict(temperature_pos=1.0, temperature_neg=1.05), "seq-mean-token-mean"),
}


@pytest.mark.parametrize("name", LOSSES)
def test_policy_losses_and_aggregations_equal_verls(name):
    theirs_name, fields, ours_name, options, agg = LOSSES[name]
    batch = parity_batch(len(name), off_policy=True)
    logp, old, mask = batch["logp"], batch["old"], batch["mask"]
    adv = batch["advantages"].unsqueeze(-1).expand_as(logp)  # verl's advantages are per token
    theirs, their_grad, _ = verl_policy_loss(theirs_name, logp, old, adv, mask, agg, **fields)
    x = logp.clone().requires_grad_(True)
    per_token, _ = POLICY_LOSSES.get(ours_name)(x, old, batch["advantages"], mask, **options)
    ours = aggregate_loss(per_token, mask, agg, norm_length=mask.shape[-1])  # verl's default: the horizon
    ours.backward()
    compare(f"policy loss: {name}", PEER, {"loss": (ours.detach(), theirs), "∇logp": (x.grad, their_grad)})


def test_a_sequence_without_trained_tokens_counts_here_not_in_verl():
    """verl's seq-mean modes leave rows without a trained token out of the mean's count; here every
    row of the mini-batch counts (the count must not depend on what a micro-batch holds)."""
    batch = parity_batch(1, off_policy=True)
    mask = batch["mask"].clone()
    mask[4] = 0
    adv = batch["advantages"].unsqueeze(-1).expand_as(mask)
    theirs, _, _ = verl_policy_loss("vanilla", batch["logp"], batch["old"], adv, mask, "seq-mean-token-mean",
                                    clip_ratio=0.2, clip_ratio_c=3.0)
    per_token, _ = POLICY_LOSSES.get("ppo_clip")(batch["logp"], batch["old"], batch["advantages"], mask, dual_clip=3.0)
    ours = aggregate_loss(per_token, mask, "seq-mean-token-mean")
    differs("aggregation: seq-mean with an empty row", PEER, {"loss": (ours, theirs)},
            "verl divides by the rows that have a trained token; here by every row of the mini-batch")


@pytest.mark.parametrize("theirs, ours", [("k2", "k2"), ("low_var_kl", "k3")])
def test_kl_estimators_equal_verls(theirs, ours):
    batch = parity_batch(2)
    values, grad = verl_kl(theirs, batch["logp"], batch["ref"])
    x = batch["logp"].clone().requires_grad_(True)
    mine = KL_ESTIMATORS.get(ours)(x, batch["ref"], x.detach(), batch["mask"])
    mine.sum().backward()
    compare(f"KL: {ours} (verl {theirs})", PEER, {"values": (mine.detach(), values), "∇logp": (x.grad, grad)})


def test_k1_has_verls_value_and_the_reverse_kl_gradient():
    """verl's k1 as a loss has gradient ∇logπ (1 per token); ``k1`` here is the detached reward-style
    term whose gradient is δ·∇logπ, the reverse KL's (algorithms/kl.py says why). Values agree on-policy."""
    batch = parity_batch(2)
    values, grad = verl_kl("k1", batch["logp"], batch["ref"])
    x = batch["logp"].clone().requires_grad_(True)
    mine = KL_ESTIMATORS.get("k1")(x, batch["ref"], x.detach(), batch["mask"])
    mine.sum().backward()
    compare("KL: k1 value", PEER, {"values": (mine.detach(), values)})
    differs("KL: k1 gradient", PEER, {"∇logp": (x.grad, grad)},
            "verl differentiates k1 itself (gradient 1 per token); here k1 is a detached reward, gradient δ·∇logπ")
