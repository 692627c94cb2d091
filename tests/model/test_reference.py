"""The lean reference of a full fine-tune: ``reference_dtype`` (a bf16 frozen copy) and
``reference_offload`` (the copy waits in CPU memory between its forwards).

Tolerance, bf16 vs fp32 reference log-probs of the same completions: a bf16 reference stores
its weights in bf16 *and* computes in bf16 (only the log-softmax is fp32), so it sees the
rounding of both: measured over 918 sampled tokens (64 prompts × 4, demo warm start), fused
kernel / plain path, max |Δ| 0.125 / 0.122, mean 0.0073 / 0.0078 (the weights' rounding alone,
computed in fp32: max 0.028, mean 0.0016); in the test's 48-token batch max 0.068, mean 0.012.
Bounds as for bf16 precision (tests/model/test_precision.py): max 0.25, mean 0.05. The KL of a
freshly started run is then no longer exactly 0 but this noise (2.3e-4 in the test).

On this CPU-only machine the offload's device moves are no-ops, so the tests show that its code
path runs, changes nothing, and leaves the parameters in CPU memory; the saving itself is
accelerator memory (one model copy), which cannot be measured here.
"""
import copy

import pytest
import tiny_task as task
import torch
from conftest import quiet_trainer

from lightning_rlpt import PromptDataModule, RLCallback, RLModule
from lightning_rlpt.model.distributed import shard_with_fsdp2
from lightning_rlpt.model.reference import frozen_copy, is_offloaded

BF16_MAX, BF16_MEAN = 0.25, 0.05
GEN = dict(max_new_tokens=4, max_prompt_length=8)


def make(path, **kw):
    return RLModule(path, reward_funcs=[task.exact_answer], **{"group_size": 4, "kl_coef": 0.05, "lr": 1e-3,
                                                                "generation": GEN, **kw})


class Probe(RLCallback):
    """The first batch's experience, the logged KL of every step, and the reference's forwards:
    where its parameters were while it ran."""

    def __init__(self):
        self.experience, self.kl, self.forward_devices = None, [], []

    def on_train_start(self, trainer, pl_module):
        ref = pl_module.reference
        if ref is not None:  # log-probs run the decoder, then the head (model/logprobs.py)
            ref.get_decoder().register_forward_pre_hook(
                lambda mod, args: self.forward_devices.append({p.device for p in ref.parameters()}))

    def on_advantages_computed(self, trainer, pl_module, experience):
        if self.experience is None:
            self.experience = copy.deepcopy(experience)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.kl.append(float(trainer.callback_metrics["kl"]))


def fit(module, rows, steps=1, **trainer_kw):
    probe = Probe()
    trainer = quiet_trainer(max_steps=steps, callbacks=[probe], **trainer_kw)
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    return trainer, probe


def param_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_bf16_reference_halves_its_bytes_and_its_logprobs_match_fp32(warm_start_dir, arithmetic_rows):
    full, lean = make(warm_start_dir), make(warm_start_dir, reference_dtype="bfloat16")
    assert {p.dtype for p in lean.reference.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in lean.policy.parameters()} == {torch.float32}  # the policy is untouched
    assert {b.dtype for b in lean.reference.buffers()} == {b.dtype for b in full.reference.buffers()}
    assert param_bytes(lean.reference) * 2 == param_bytes(full.reference)
    _, want = fit(full, arithmetic_rows)
    _, got = fit(lean, arithmetic_rows)
    exp, ref_exp = got.experience, want.experience
    assert torch.equal(exp.completion_ids, ref_exp.completion_ids)  # same policy, same seeds: same rollout
    assert exp.ref_logprobs.dtype == torch.float32  # log-softmax in fp32 over the bf16 forward
    diff = (exp.ref_logprobs - ref_exp.ref_logprobs)[exp.completion_mask.bool()].abs()
    assert 0 < diff.max() < BF16_MAX and diff.mean() < BF16_MEAN, f"max |Δ| {diff.max():.4f}, mean {diff.mean():.4f}"
    # The fp32 copy *is* the policy before the first step: 0 up to the two kernels' fp32 rounding (the
    # loss's log-probs come from the forward-pass head path, the reference's from the fused kernel).
    assert abs(want.kl[0]) < 1e-7
    assert 0 < got.kl[0] < 0.01  # the bf16 copy differs by its rounding: a small KL floor


def test_bf16_reference_is_checkpointed_in_bf16(warm_start_dir, arithmetic_rows, tmp_path):
    module = make(warm_start_dir, reference_dtype="bfloat16")
    trainer, _ = fit(module, arithmetic_rows)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)["state_dict"]
    refs = {k: v for k, v in state.items() if k.startswith("reference.")}
    assert refs and {v.dtype for v in refs.values()} == {torch.bfloat16}
    fresh = make(warm_start_dir, reference_dtype="bfloat16")
    fresh.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(fresh.reference.parameters(), module.reference.parameters()))


def test_offloaded_reference_runs_its_path_changes_nothing_and_stays_in_cpu_memory(warm_start_dir, arithmetic_rows):
    plain, offloaded = make(warm_start_dir), make(warm_start_dir, reference_offload=True)
    assert is_offloaded(offloaded.reference) and not is_offloaded(plain.reference)
    _, want = fit(plain, arithmetic_rows, steps=2)
    _, got = fit(offloaded, arithmetic_rows, steps=2)
    # The reference ran once per training batch, on the policy's device (the CPU here).
    assert got.forward_devices == [{offloaded.device}] * 2
    assert {p.device.type for p in offloaded.reference.parameters()} == {"cpu"}
    assert got.kl == want.kl
    assert torch.equal(got.experience.ref_logprobs, want.experience.ref_logprobs)
    assert all(torch.equal(a, b) for a, b in zip(offloaded.policy.parameters(), plain.policy.parameters()))


@pytest.mark.parametrize("kw", [dict(lora=dict(r=4), reference_dtype="bfloat16"),
                                dict(lora=dict(r=4), quantization="nf4", reference_offload=True)],
                         ids=["lora-dtype", "qlora-offload"])
def test_lean_options_refused_under_lora_before_the_model_loads(kw, warm_start_dir, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr("lightning_rlpt.module.load_policy", no_load)
    with pytest.raises(ValueError, match=r"under LoRA/QLoRA the reference is the base model with the adapters "
                                         r"disabled.*drop these options"):
        make(warm_start_dir, **kw)


def test_lean_options_refused_for_a_peft_model_given_as_a_module():
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(task.build_model(), LoraConfig(r=4, target_modules="all-linear"))
    with pytest.raises(ValueError, match=r"under LoRA/QLoRA the reference is the base model"):
        make(peft_model, tokenizer=task.build_tokenizer(), reference_offload=True)


@pytest.mark.parametrize("dtype", ["int8", "fp8", torch.int8])
def test_unknown_reference_dtype(dtype, warm_start_dir):
    with pytest.raises(ValueError, match=r"reference_dtype must be one of float32, bfloat16, float16 or None"):
        make(warm_start_dir, reference_dtype=dtype)


def test_lean_options_without_a_reference_warn(warm_start_dir):
    with pytest.warns(UserWarning, match=r"reference_dtype / reference_offload have no effect: this run builds no "
                                         r"reference \(kl_coef=0"):
        module = make(warm_start_dir, kl_coef=0.0, reference_dtype="bfloat16")
    assert module.reference is None


def test_offloaded_reference_refused_under_fsdp2():
    """`RLModule.configure_model` shards the reference with this function under
    ModelParallelStrategy: an offloaded copy fails there, before any rollout or sharding."""
    with pytest.raises(ValueError, match=r"reference_offload=True is not supported under ModelParallelStrategy "
                                         r"\(FSDP2\).*Drop reference_offload"):
        shard_with_fsdp2(frozen_copy(task.build_model(), offload=True), mesh=None)


def test_frozen_copy_casts_while_copying_and_keeps_ties():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=15, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=1, head_dim=64, tie_word_embeddings=True))
    ref = frozen_copy(model, torch.bfloat16)
    assert ref.lm_head.weight is ref.model.embed_tokens.weight  # a tied head stays tied
    assert not any(p.requires_grad for p in ref.parameters())
    assert torch.equal(ref.lm_head.weight, model.lm_head.weight.detach().to(torch.bfloat16))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the source is untouched
