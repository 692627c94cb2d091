"""``Trainer(precision=...)`` end to end on CPU: the policy and its frozen reference follow the
precision, log-probs and the loss stay fp32, and fp16 on CPU is refused before any rollout.

Tolerances, bf16 vs fp32 log-probs of the same completions (demo warm start, 2 layers × 128,
logits up to 8.7 in size). bf16 keeps 8 significant bits: every rounded matmul input and output
moves by up to 2**-9 relative, and a log-prob is a difference of logits of that size, so single
tokens move by ~0.1 while the mean stays small. Measured over 918 sampled tokens (64 prompts × 4),
fused kernel / plain path: bf16-true policy vs the same weights computed in fp32, max |Δ|
0.103 / 0.110, mean 0.0069 / 0.0076; bf16-mixed (autocast) vs fp32, max 0.127 / 0.126, mean
0.0035 / 0.0044. The tests' 48-token batches (after two steps at lr 1e-3) saw max 0.124 and
mean up to 0.021. Bounds: ``BF16_MAX = 0.25`` (twice the largest seen), ``BF16_MEAN = 0.05``.
For scale: PPO's clip ε = 0.2 is |Δ log p| ≈ 0.18, so old and new log-probs must come from the
same precision (they do: both from the learner).
"""
import copy
import re
import warnings

import lightning as L
import pytest
import tiny_task as task
import torch
from conftest import quiet_trainer
from lightning.pytorch.plugins import MixedPrecision

from lightning_rlpt import PromptDataModule, RLCallback, RLModule
from lightning_rlpt.model.logprobs import completion_logprobs
from lightning_rlpt.model.precision import lost_update_fraction, precision_dtype

BF16_MAX, BF16_MEAN = 0.25, 0.05
GEN = dict(max_new_tokens=4, max_prompt_length=8)
MODES = {
    "full": {},
    "lora": {"lora": dict(r=4, lora_alpha=8)},
    "qlora": {"lora": dict(r=4, lora_alpha=8), "quantization": "nf4"},
}


def make(path, **kw):
    return RLModule(path, reward_funcs=[task.exact_answer], **{"group_size": 4, "kl_coef": 0.05, "lr": 1e-3,
                                                                "generation": GEN, **kw})


class Probe(RLCallback):
    """What the run computed with: dtypes after the strategy set up, the autocast state inside the
    training step, the loss dtype, and the first batch's experience."""

    def __init__(self):
        self.experience, self.losses, self.autocast = None, [], []

    def on_train_start(self, trainer, pl_module):
        self.policy_dtypes = {p.dtype for p in pl_module.policy.parameters() if p.is_floating_point()}
        self.reference_dtypes = ({p.dtype for p in pl_module.reference.parameters()}
                                 if pl_module.reference is not None else set())

    def on_advantages_computed(self, trainer, pl_module, experience):
        self.autocast.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        if self.experience is None:
            self.experience = copy.deepcopy(experience)

    def on_before_backward(self, trainer, pl_module, loss):
        self.losses.append(loss.detach())


def fit(module, rows, precision, steps=2, **trainer_kw):
    probe = Probe()
    trainer = quiet_trainer(max_steps=steps, precision=precision, callbacks=[probe], **trainer_kw)
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    return trainer, probe


def logprobs(model, exp, fused=True):
    with torch.no_grad():
        return completion_logprobs(model, exp.input_ids, exp.attention_mask, exp.completion_ids.shape[1],
                                   use_fused_kernel=fused)[0]


def check_close(a, b, exp, what):
    diff = (a - b)[exp.completion_mask.bool()].abs()
    assert 0 < diff.max() < BF16_MAX and diff.mean() < BF16_MEAN, f"{what}: max |Δ log p| = {diff.max():.4f}, " \
                                                                   f"mean {diff.mean():.4f}"


def test_bf16_true_fit_converts_policy_and_reference_and_matches_fp32(warm_start_dir, arithmetic_rows):
    """The acceptance test: a bf16-true fit runs on CPU (HF generate in bf16), the reference is
    converted with the policy, log-probs and the loss are fp32, and the bf16 policy's log-probs
    agree with the same weights in fp32 within the bounds above."""
    module = make(warm_start_dir)
    trainer, probe = fit(module, arithmetic_rows, "bf16-true")
    assert trainer.global_step == 2
    assert probe.policy_dtypes == probe.reference_dtypes == {torch.bfloat16}
    assert [loss.dtype for loss in probe.losses] == [torch.float32] * 2
    assert all(torch.isfinite(loss) for loss in probe.losses)
    exp = probe.experience
    assert exp.ref_logprobs.dtype == torch.float32 and exp.completion_mask.sum() > 0
    fp32_twin = copy.deepcopy(module.policy).float()
    for fused in (True, False):
        low, high = logprobs(module.policy, exp, fused), logprobs(fp32_twin, exp, fused)
        assert low.dtype == torch.float32
        check_close(low, high, exp, f"bf16-true, fused={fused}")


def test_bf16_mixed_fit_keeps_fp32_weights_and_runs_under_autocast(warm_start_dir, arithmetic_rows):
    module = make(warm_start_dir)
    fp32_start = copy.deepcopy(module.policy)
    _, probe = fit(module, arithmetic_rows, "bf16-mixed", steps=1)
    assert probe.policy_dtypes == probe.reference_dtypes == {torch.float32}
    assert probe.autocast == [(True, torch.bfloat16)]  # the rollout and its log-probs ran under autocast
    assert [loss.dtype for loss in probe.losses] == [torch.float32]
    exp = probe.experience
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = logprobs(fp32_start, exp)
    check_close(mixed, logprobs(fp32_start, exp), exp, "bf16-mixed")
    torch.testing.assert_close(exp.ref_logprobs, mixed, atol=1e-6, rtol=0)  # the reference ran mixed too


@pytest.mark.parametrize("precision", ["bf16-true", "bf16-mixed"])
@pytest.mark.parametrize("mode", ["lora", "qlora"])
def test_lora_and_qlora_train_under_bf16(precision, mode, warm_start_dir, arithmetic_rows):
    module = make(warm_start_dir, lr=1e-2, **MODES[mode])
    before = {n: p.detach().float().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
    _, probe = fit(module, arithmetic_rows, precision)
    want = torch.bfloat16 if precision == "bf16-true" else torch.float32
    assert probe.policy_dtypes == {want} and probe.reference_dtypes == set()  # no copy under LoRA
    if mode == "qlora":
        assert any(type(p).__name__ == "Params4bit" for p in module.policy.parameters())  # still 4-bit
    assert all(torch.isfinite(loss) and loss.dtype == torch.float32 for loss in probe.losses)
    after = dict(module.policy.named_parameters())
    assert all(not torch.equal(before[n], after[n].detach().float()) for n in before)


class CountRollouts(RLCallback):
    def __init__(self):
        self.rollouts = 0

    def on_rollout_end(self, trainer, pl_module, experience):
        self.rollouts += 1


@pytest.mark.parametrize("trainer_kw", [dict(precision="16-true"), dict(plugins=[MixedPrecision("16-mixed", "cpu")])],
                         ids=["16-true", "16-mixed-plugin"])
def test_fp16_on_cpu_is_refused_before_any_rollout(trainer_kw, warm_start_dir, arithmetic_rows):
    module, counter = make(warm_start_dir), CountRollouts()
    trainer = quiet_trainer(max_steps=1, callbacks=[counter], **trainer_kw)
    with pytest.raises(ValueError, match=r"precision='16-(true|mixed)' computes in float16 on CPU, which is not "
                                         r"supported.*Use precision='bf16-mixed'.*or 'bf16-true'"):
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert counter.rollouts == 0 and module.policy_version == 0


def test_16_mixed_on_cpu_becomes_bf16_mixed_with_lightnings_warning():
    """``precision="16-mixed"`` never reaches the module on CPU: Lightning swaps in bf16-mixed
    when the Trainer is built, and says so (the refusal above covers a plugin given directly)."""
    with pytest.warns(UserWarning, match=r"AMP with fp16 is not supported on CPU. Using `precision='bf16-mixed'`"):
        trainer = L.Trainer(accelerator="cpu", precision="16-mixed", logger=False)
    assert trainer.precision == "bf16-mixed"


def test_bf16_true_warns_when_the_learning_rate_is_below_bf16_rounding(warm_start_dir, arithmetic_rows):
    """At lr=1e-6 (a usual RL rate) bf16 weights cannot take most AdamW steps: the warning's share
    is a lower bound on the weights a real step leaves unchanged."""
    module = make(warm_start_dir, lr=1e-6, kl_coef=0.0, max_grad_norm=None)
    start = {n: p.detach().to(torch.bfloat16) for n, p in module.policy.named_parameters()}
    with pytest.warns(UserWarning, match=r"stores the trained weights in bfloat16: an optimizer step of lr=1e-06 is "
                                         r"below the rounding of (\d+)% of them.*Use precision='bf16-mixed'") as rec:
        fit(module, arithmetic_rows, "bf16-true", steps=1)
    warned = int(re.search(r"rounding of (\d+)%", "".join(str(w.message) for w in rec)).group(1))
    unchanged = sum(int((p.detach() == start[n]).sum()) for n, p in module.policy.named_parameters())
    total = sum(p.numel() for p in module.policy.parameters())
    assert unchanged / total >= warned / 100 > 0.9


def test_no_lost_update_warning_under_bf16_mixed(warm_start_dir, arithmetic_rows):
    module = make(warm_start_dir, lr=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", module="lightning.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        fit(module, arithmetic_rows, "bf16-mixed", steps=1)


def test_lost_update_fraction_by_hand():
    # bf16 eps = 2**-7: a step of lr is surely lost where |w| > 4 * lr / eps = 512 * lr = 5.12e-4.
    weights = [torch.tensor([1e-5, -5e-4, 0.02]), torch.tensor([-0.6])]
    assert lost_update_fraction(weights, 1e-6, torch.bfloat16) == 0.5
    assert lost_update_fraction(weights, 1e-2, torch.bfloat16) == 0.0
    assert lost_update_fraction(weights, 1e-6, torch.float32) == 0.0  # eps 2**-23: limit 33.6


@pytest.mark.parametrize("precision, dtype", [("bf16-true", torch.bfloat16), ("bf16-mixed", torch.bfloat16),
                                              ("16-mixed", torch.float16), ("16-true", torch.float16),
                                              ("32-true", None), ("64-true", None), ("transformer-engine", None)])
def test_precision_dtype(precision, dtype):
    assert precision_dtype(precision) == dtype


def test_bf16_on_a_cpu_without_bf16_instructions_is_refused_before_any_rollout(monkeypatch, warm_start_dir,
                                                                               arithmetic_rows):
    from lightning_rlpt.model import precision

    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: set())
    monkeypatch.delenv(precision.ALLOW_SLOW_BF16)  # tests/conftest.py sets it for the bf16 cases
    module, counter = make(warm_start_dir), CountRollouts()
    trainer = quiet_trainer(max_steps=1, callbacks=[counter], precision="bf16-mixed")
    with pytest.raises(ValueError, match=r"precision='bf16-mixed' computes in bfloat16, and this CPU has no bf16 "
                                         r"instructions.*Use precision='32-true'.*LIGHTNING_RLPT_ALLOW_SLOW_BF16=1"):
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert counter.rollouts == 0 and module.policy_version == 0
    monkeypatch.setenv(precision.ALLOW_SLOW_BF16, "1")  # asked for: it runs
    precision.check_cpu_precision(trainer)


def test_the_cpus_bf16_flags_are_read_from_cpuinfo(tmp_path):
    from lightning_rlpt.model.precision import cpu_bf16_flags

    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert cpu_bf16_flags(str(x86)) == set()
    assert cpu_bf16_flags(str(arm)) == {"bf16"}
    x86.write_text("flags\t\t: fpu avx512f avx512_bf16 amx_bf16\n")
    assert cpu_bf16_flags(str(x86)) == {"avx512_bf16", "amx_bf16"}
    assert cpu_bf16_flags(str(tmp_path / "absent")) is None  # not judged
