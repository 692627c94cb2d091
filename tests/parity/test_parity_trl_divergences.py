"""The divergences from TRL 1.16 that issue 36 listed, one test each (all failed before the fix;
item 7, the GRPOConfig fields, is tests/parity/test_parity_trl_fields.py). Each runs TRL's own
code on the settings that showed the divergence (`check_setting`) and checks the converter's
part of the fix."""
import pytest

from lightning_rlpt.algorithms.entropy_bonus import entropy_bonus
from lightning_rlpt.compat.trl import GRPOConfig, from_grpo_config
from parity_trl import trl_config
from test_parity_trl_loss import check_setting

import torch


def test_1_the_entropy_bonus_is_a_mean_over_the_kept_tokens(warm_start_dir):
    """TRL 1.16 divides the bonus by ``(mask * entropy_mask).sum()``; it was divided by every trained token."""
    for name in ("top_entropy_quantile 0.5, entropy bonus 0.01", "top_entropy_quantile 0.5, entropy bonus, grpo, μ=2"):
        check_setting(name, warm_start_dir)
    h, mask, kept = torch.tensor([[1.0, 3.0, 5.0]]), torch.ones(1, 3), torch.tensor([[0.0, 1.0, 1.0]])
    assert entropy_bonus(h, mask, num_tokens=2, policy_mask=kept).item() == 4.0


def test_2_bias_corrected_kl_is_trls_default(warm_start_dir):
    """``use_bias_correction_kl`` is True in TRL 1.16: an absent field means ``k3_ratio``, not ``k3``."""
    assert trl_config().use_bias_correction_kl is True
    for config in ({"beta": 0.04}, GRPOConfig(beta=0.04), trl_config(beta=0.04)):
        assert from_grpo_config(config).module["kl_estimator"] == "k3_ratio"
    for name in ("β 0.04, bias-corrected KL (default), on-policy", "β 0.04, bias-corrected KL, μ=2"):
        check_setting(name, warm_start_dir)


def test_3_gspo_multiplies_k3_by_the_differentiable_sequence_ratio(warm_start_dir):
    assert from_grpo_config(dict(importance_sampling_level="sequence", beta=0.04)).module["kl_estimator"] == \
        "k3_seq_ratio"
    for name in ("β 0.04, grpo, bias-corrected KL, sequence level, on-policy",
                 "β 0.04, grpo, bias-corrected KL, sequence level, μ=2"):
        check_setting(name, warm_start_dir)


@pytest.mark.parametrize("mode", ["sequence_mask", "sequence_truncate"])
def test_4_vespo_honours_token_mask_and_refuses_the_sequence_modes(mode, warm_start_dir):
    """token_mask was ignored (always truncated; the loss had the opposite sign); TRL refuses VESPO
    with the sequence modes, which were accepted."""
    for name in ("vespo, token_mask, cap 1.5", "vespo, correction off"):
        check_setting(name, warm_start_dir)
    with pytest.raises(ValueError, match=f"vllm_importance_sampling_mode='{mode}' with loss_type='vespo': .*"
                                         "use 'token_truncate' or 'token_mask'"):
        from_grpo_config(dict(loss_type="vespo", vllm_importance_sampling_mode=mode))


def test_5_a_nan_sampler_logprob_weighs_one(warm_start_dir):
    """TRL maps the token's log-ratio to 0 (``nan_to_num``); the loss here was NaN."""
    for name in ("correction token_truncate, a NaN sampler log-prob", "correction sequence_mask, a NaN sampler log-prob",
                 "vespo, a NaN sampler log-prob"):
        check_setting(name, warm_start_dir)


def test_6_sequence_level_metrics_and_the_corrected_kl_metric(warm_start_dir):
    """GSPO's clip_ratio/* and VESPO's phi_seq_mean are means over sequences in TRL (they were token
    means); the kl metric under bias correction is k3 × ratio (it was plain k3)."""
    for name in ("gspo: grpo at sequence level, μ=2", "vespo, token_truncate, μ=2",
                 "β 0.04, use_bias_correction_kl=True given, μ=2 (the kl metric is k3 × ratio)"):
        check_setting(name, warm_start_dir)
