"""The fused LM head under FSDP2: two gloo processes, each scoring its own rows with a tiny model
sharded by `shard_with_fsdp2`, give the log-probs, entropies and (rank-averaged) gradients of an
unsharded copy on the plain full-logits path. fp32; tolerance 1e-5 absolute (log-probs, entropies,
gradients), measured differences ≤ 2e-6."""
import os
import subprocess
import sys

import pytest
from conftest import TESTS
import torch

SCRIPT = os.path.join(TESTS, "scripts", "fsdp2_fused_head.py")
ATOL = 1e-5


def _run(tmp_path, *flags: str) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path), *flags], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "returned a view tensor" not in proc.stderr, "FSDP2 warned about a view output"
    return torch.load(tmp_path / "result.pt")


def _assert_matches_plain(result: dict, fused: bool) -> None:
    for rank, arms in enumerate(result["ranks"]):
        (no_grad, logp, entropy, ran_fused), (ref_no_grad, ref_logp, ref_entropy, _) = arms["sharded"], arms["reference"]
        assert ran_fused == fused, f"rank {rank}: fused op in the graph: {ran_fused}, expected {fused}"
        for name, a, b in (("no-grad log-probs", no_grad, ref_no_grad), ("log-probs", logp, ref_logp),
                           ("entropies", entropy, ref_entropy)):
            assert torch.allclose(a, b, atol=ATOL, rtol=0), f"rank {rank} {name}: {(a - b).abs().max()}"
    grads, ref = result["grads"], result["ref_grads"]
    assert grads.keys() == ref.keys() and len(grads) >= 10
    for name in ref:
        assert ref[name].abs().max() > 0, f"{name}: zero reference gradient, the check would be vacuous"
        assert grads[name] is not None, f"{name}: no gradient reached the sharded parameter"
        diff = (grads[name] - ref[name]).abs().max()
        assert diff <= ATOL, f"{name}: gradient differs from the plain path by {diff}"


@pytest.mark.slow
def test_tied_fused_head_under_fsdp2_equals_plain_path(tmp_path):
    """Qwen2 with tied embeddings: the head's gradient and the embedding's meet in one gathered
    parameter, reduce-scattered once."""
    _assert_matches_plain(_run(tmp_path, "--model", "qwen2"), fused=True)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [("--model", "llama"), ("--model", "llama", "--padding-free"),
                                   ("--model", "qwen2", "--plain"), ("--model", "llama", "--lora")],
                         ids=["untied", "untied-padding-free", "tied-plain-head", "lora"])
def test_sharded_head_equals_plain_path(flags, tmp_path):
    """An untied Llama (the head a parameter of its own), padded and packed; the full-logits head
    under FSDP2 (``use_fused_kernel=False``), which runs the same body under the root's hooks; and
    a LoRA on the attention and the head (the fused op on ``W + s·B·A``, gradients to A and B)."""
    _assert_matches_plain(_run(tmp_path, *flags), fused="--plain" not in flags)
