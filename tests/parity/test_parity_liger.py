"""Liger-Kernel 0.8.5's chunked GRPO loss (``LigerFusedLinearGRPOLoss``, ``compiled=False``: its
PyTorch path, which runs on CPU; its Triton kernels need a GPU and stay in ``make gpu-check``)
against this project's fused head (``fused_logprobs``, chunked) feeding `RLModule.loss`: the same
hidden states, LM-head weight and targets in float64; the loss and its gradients in both."""
import pytest
import torch

from parity_ours import module_for, our_fused_loss, parity_batch
from parity_record import compare

liger = pytest.importorskip("liger_kernel.chunked_loss", reason="pip install --no-deps liger-kernel==0.8.5")

H, V, T = 8, 11, 0.9  # hidden size, vocabulary, sampling temperature

# name: (GRPOConfig fields shared by both sides, batch options)
SETTINGS = {
    "dapo": ({}, {}),
    "grpo, β 0.04, bias-corrected KL, μ=2": (dict(loss_type="grpo", beta=0.04, num_iterations=2),
                                               dict(off_policy=True)),
    "grpo, β 0.04, plain k3": (dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False), {}),
    "dr_grpo, μ=2": (dict(loss_type="dr_grpo", num_iterations=2), dict(off_policy=True)),
    "bnpo, clip-higher, μ=2": (dict(loss_type="bnpo", epsilon_high=0.28, num_iterations=2), dict(off_policy=True)),
    "cispo, cap 5, μ=2": (dict(loss_type="cispo", epsilon_high=5.0, num_iterations=2), dict(off_policy=True)),
    "sapo, μ=2": (dict(loss_type="sapo", num_iterations=2), dict(off_policy=True)),
    "gspo (grpo at sequence level), μ=2": (dict(loss_type="grpo", importance_sampling_level="sequence",
                                                num_iterations=2), dict(off_policy=True)),
}
LIGER_ARGS = ("beta", "epsilon_high", "loss_type", "importance_sampling_level", "use_bias_correction_kl")


def liger_loss(fields, batch, hidden, weight, targets):
    cfg = {"beta": 0.0, "epsilon_high": None, "loss_type": "dapo", "importance_sampling_level": "token",
           "use_bias_correction_kl": True, **fields}
    high = cfg["epsilon_high"] if cfg["epsilon_high"] is not None else 0.2
    loss_fn = liger.LigerFusedLinearGRPOLoss(
        beta=cfg["beta"], compiled=False, use_ref_model=cfg["beta"] != 0, chunk_size=2, epsilon_low=0.2,
        epsilon_high=high, loss_type=cfg["loss_type"], max_completion_length=batch["mask"].shape[1],
        importance_sampling_level=cfg["importance_sampling_level"], temperature=T,
        use_bias_correction_kl=cfg["use_bias_correction_kl"])
    x, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss, _ = loss_fn(x, w, targets, batch["mask"], batch["advantages"], ref_per_token_logps=batch["ref"],
                      old_per_token_logps=batch.get("old"))
    loss.backward()
    return loss.detach(), {"hidden": x.grad, "weight": w.grad}


@pytest.mark.parametrize("name", SETTINGS)
def test_loss_and_gradients_equal_ligers(name, warm_start_dir):
    fields, options = SETTINGS[name]
    assert set(fields) - {"num_iterations"} <= set(LIGER_ARGS)
    batch = parity_batch(len(name), **options)
    g = torch.Generator().manual_seed(len(name))
    n, c = batch["mask"].shape
    hidden = torch.randn(n, c, H, dtype=torch.float64, generator=g)
    weight = 0.5 * torch.randn(V, H, dtype=torch.float64, generator=g)
    targets = torch.randint(0, V, (n, c), generator=g)
    if "old" in batch:  # π_old near the policy the hidden states give, so ratios stay near the clip range
        from lightning_rlpt.kernels import fused_logprobs
        batch["old"] = fused_logprobs(hidden, weight, targets, temperature=T, impl="chunked")[0] + \
            0.1 * torch.randn(n, c, dtype=torch.float64, generator=g)
    batch["ref"] = batch["ref"] * 0 + fused_logprobs_ref(hidden, weight, targets, g)
    theirs, their_grads = liger_loss(fields, batch, hidden, weight, targets)
    module = module_for(dict(num_generations=3, max_completion_length=c, per_device_train_batch_size=6,
                             temperature=T, **fields), warm_start_dir)
    ours, _, our_grads = our_fused_loss(module, batch, hidden, weight, targets, temperature=T)
    # Liger's chunks compute in float32 whatever the inputs' dtype: 1e-5 relative, not 1e-6
    compare(name, "Liger-Kernel 0.8.5 (CPU, compiled=False)",
            {"loss": (ours, theirs), **{f"∇{k}": (our_grads[k], their_grads[k]) for k in ("hidden", "weight")}},
            rtol=1e-5, atol=1e-7)


def fused_logprobs_ref(hidden, weight, targets, g):
    """Reference log-probs a little away from the policy's (a k3 of a realistic size)."""
    from lightning_rlpt.kernels import fused_logprobs
    return fused_logprobs(hidden, weight, targets, temperature=T, impl="chunked")[0] + \
        0.2 * torch.randn(targets.shape, dtype=torch.float64, generator=g)
