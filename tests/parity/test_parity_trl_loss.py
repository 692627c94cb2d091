"""TRL 1.16's ``GRPOTrainer._compute_loss``, run on a stand-in trainer (tests/parity/parity_trl.py),
against `RLModule.loss` with the config converted by `from_grpo_config`: the same float64 tensors
in, the loss, its gradient (log-probs and entropies) and every metric logged under the same name
out, to 1e-6 relative. One setting per row; none is skipped."""
import pytest

from parity_ours import module_for, our_loss, parity_batch
from parity_record import compare
from parity_trl import compute_loss, trl_config

OFF = dict(off_policy=True)  # μ > 1: π_old differs from π (num_iterations=2)
SAMPLER = dict(behaviour=True)  # the engine's log-probs (TRL: vLLM)

# name: (GRPOConfig fields, batch options)
SETTINGS = {
    "dapo (TRL's default)": ({}, {}),
    "dapo, clip-higher 0.28, μ=2": (dict(epsilon_high=0.28, num_iterations=2), OFF),
    "grpo, μ=2": (dict(loss_type="grpo", num_iterations=2), OFF),
    "dr_grpo, μ=2": (dict(loss_type="dr_grpo", num_iterations=2), OFF),
    "bnpo, μ=2": (dict(loss_type="bnpo", num_iterations=2), OFF),
    "cispo, cap 5, μ=2": (dict(loss_type="cispo", epsilon_high=5.0, num_iterations=2), OFF),
    "sapo, μ=2": (dict(loss_type="sapo", num_iterations=2), OFF),
    "luspo (sequence), μ=2": (dict(loss_type="luspo", importance_sampling_level="sequence", num_iterations=2), OFF),
    "gspo: grpo at sequence level, μ=2": (dict(loss_type="grpo", importance_sampling_level="sequence",
                                               epsilon=3e-4, epsilon_high=4e-4, num_iterations=2), OFF),
    "gspo: dapo at sequence level, μ=2": (dict(importance_sampling_level="sequence", num_iterations=2), OFF),
    "β 0.04, bias-corrected KL (default), on-policy": (dict(beta=0.04), {}),
    "β 0.04, bias-corrected KL, μ=2": (dict(beta=0.04, num_iterations=2), OFF),
    "β 0.04, use_bias_correction_kl=True given, μ=2 (the kl metric is k3 × ratio)": (
        dict(beta=0.04, use_bias_correction_kl=True, num_iterations=2), OFF),
    "β 0.04, plain k3, μ=2": (dict(beta=0.04, use_bias_correction_kl=False, num_iterations=2), OFF),
    "β 0.04, grpo, bias-corrected KL, sequence level, on-policy": (
        dict(beta=0.04, loss_type="grpo", importance_sampling_level="sequence"), {}),
    "β 0.04, grpo, bias-corrected KL, sequence level, μ=2": (
        dict(beta=0.04, loss_type="grpo", importance_sampling_level="sequence", num_iterations=2), OFF),
    "β 0.04, grpo, plain k3, sequence level, μ=2": (
        dict(beta=0.04, loss_type="grpo", importance_sampling_level="sequence", use_bias_correction_kl=False,
             num_iterations=2), OFF),
    "correction sequence_mask (default), cap 3": ({}, SAMPLER),
    "correction sequence_truncate, cap 3": (dict(vllm_importance_sampling_mode="sequence_truncate"), SAMPLER),
    "correction token_truncate, cap 2, μ=2": (dict(vllm_importance_sampling_mode="token_truncate",
                                                   vllm_importance_sampling_clip_max=2.0, num_iterations=2),
                                              dict(SAMPLER, **OFF)),
    "correction token_mask, cap 1.5": (dict(vllm_importance_sampling_mode="token_mask",
                                            vllm_importance_sampling_clip_max=1.5), SAMPLER),
    "correction token_truncate, a NaN sampler log-prob": (dict(vllm_importance_sampling_mode="token_truncate"),
                                                          dict(SAMPLER, nan_behaviour=True)),
    "correction sequence_mask, a NaN sampler log-prob": ({}, dict(SAMPLER, nan_behaviour=True)),
    "vespo, token_truncate, μ=2": (dict(loss_type="vespo", vllm_importance_sampling_mode="token_truncate",
                                        num_iterations=2), dict(SAMPLER, **OFF)),
    "vespo, token_mask, cap 1.5": (dict(loss_type="vespo", vllm_importance_sampling_mode="token_mask",
                                        vllm_importance_sampling_clip_max=1.5), SAMPLER),
    "vespo, correction off": (dict(loss_type="vespo", vllm_importance_sampling_correction=False), SAMPLER),
    "vespo, a NaN sampler log-prob": (dict(loss_type="vespo", vllm_importance_sampling_mode="token_truncate"),
                                      dict(SAMPLER, nan_behaviour=True)),
    "entropy bonus 0.01": (dict(entropy_coef=0.01), {}),
    "entropy bonus 0.01, grpo": (dict(entropy_coef=0.01, loss_type="grpo"), {}),
    "top_entropy_quantile 0.5": (dict(top_entropy_quantile=0.5), {}),
    "top_entropy_quantile 0.5, entropy bonus 0.01": (dict(top_entropy_quantile=0.5, entropy_coef=0.01), {}),
    "top_entropy_quantile 0.5, entropy bonus, grpo, μ=2": (
        dict(top_entropy_quantile=0.5, entropy_coef=0.01, loss_type="grpo", num_iterations=2), OFF),
    "mask_truncated_completions": (dict(mask_truncated_completions=True), dict(truncated=True)),
    "mask_truncated_completions, grpo, β 0.04, μ=2": (
        dict(mask_truncated_completions=True, loss_type="grpo", beta=0.04, num_iterations=2),
        dict(truncated=True, **OFF)),
}


@pytest.mark.parametrize("name", SETTINGS)
def test_loss_gradient_and_metrics_equal_trls(name, warm_start_dir):
    check_setting(name, warm_start_dir)


def check_setting(name, model_dir):
    """Run setting ``name`` through TRL and here; assert and record the agreement."""
    fields, options = SETTINGS[name]
    fields = dict(num_generations=3, max_completion_length=5, per_device_train_batch_size=6, **fields)
    batch = parity_batch(seed=len(name), **options)
    theirs, their_metrics, their_grads = compute_loss(trl_config(**fields), batch)
    ours, our_metrics, our_grads = our_loss(module_for(fields, model_dir), batch)
    shared = sorted(set(their_metrics) & set(our_metrics))
    pairs = {"loss": (ours, theirs), **{m: (our_metrics[m], their_metrics[m]) for m in shared}}
    pairs.update({f"∇{k}": (our_grads[k], their_grads[k]) for k in ("logp", "entropy")
                  if their_grads[k] is not None or our_grads[k] is not None})
    assert {"kl", "entropy"} & set(their_metrics) <= set(shared)
    compare(name, "TRL 1.16", pairs)
