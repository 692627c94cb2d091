"""A LoRA policy under FSDP2 rolls out with the default `HFGenerateEngine` (``transformers.generate``
through peft) on two gloo processes, and trains like one process holding the whole batch; so does
a QLoRA policy (the base in bitsandbytes nf4, sharded as 4-bit storage and gathered whole for
each forward, where bitsandbytes restores its quantization state).

Tolerance: trained LoRA weights to 1e-6 absolute, measured differences ≤ 2.3e-8 while every LoRA
B moved from 0 by 0.004 to 0.09. Plain SGD, so the update is the gradient itself (Adam's first
steps would hide a wrongly scaled one); gradients left unreduced on each rank moved them 0.09 off."""
import json
import os
import subprocess
import sys

import pytest
from conftest import TESTS
import torch

SCRIPT = os.path.join(TESTS, "scripts", "fsdp2_lora_fit.py")
STEPS = 2


def _fit(strategy: str, out, *flags: str) -> tuple[list[list], dict[str, torch.Tensor]]:
    """Rollouts (each a sorted list of ``(index, row, completion)`` over every rank) and rank 0's LoRA weights."""
    out.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, SCRIPT, "--strategy", strategy, "--out", str(out), "--steps", str(STEPS),
                           *flags], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = range(1 if strategy == "single" else 2)
    per_rank = [json.load(open(out / f"rollouts_rank{r}.json")) for r in ranks]
    assert all(len(rollouts) == STEPS for rollouts in per_rank)
    rollouts = [sorted((i, j, tuple(c)) for rank in per_rank for i, j, c in rank[step]) for step in range(STEPS)]
    weights = [torch.load(out / f"lora_rank{r}.pt") for r in ranks]
    assert all(torch.equal(weights[0][k], w[k]) for w in weights for k in weights[0]), "ranks hold different weights"
    return rollouts, weights[0]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [(), ("--quantization", "nf4")], ids=["lora", "qlora"])
def test_lora_policy_under_fsdp2_generates_and_trains_like_one_process(flags, tmp_path):
    """peft's ``generate`` runs the inner model's forward, not the FSDP2 root's, so without
    `run_as_root_forward` the root's embeddings stay sharded and the first rollout fails."""
    one_rollouts, one = _fit("single", tmp_path / "single", *flags)
    two_rollouts, two = _fit("fsdp2", tmp_path / "fsdp2", *flags)
    assert len(one_rollouts[0]) == 4 * 4 and all(c for _, _, c in one_rollouts[0])  # 4 prompts × G = 4
    assert two_rollouts[0] == one_rollouts[0], "the first rollout differs from one process's"
    assert two_rollouts[1] == one_rollouts[1], "the rollout after a step differs from one process's"
    assert one.keys() == two.keys() and all("lora_" in k for k in one) and len(one) == 28
    for key in one:
        if "lora_B" in key:
            assert one[key].abs().max() > 1e-3, f"{key}: barely trained (from 0), the comparison would be vacuous"
        diff = (one[key] - two[key]).abs().max()
        assert diff <= 1e-6, f"{key}: FSDP2 and one process differ by {diff}"
