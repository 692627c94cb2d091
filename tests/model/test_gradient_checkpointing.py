"""Gradient checkpointing (`RLModule(gradient_checkpointing=True)`, HF's non-reentrant
checkpointing of every decoder layer): the same gradients as without it, for full fine-tuning,
LoRA and QLoRA, with micro-batches and under FSDP2, while the layers really are recomputed in
backward (each runs twice per micro-batch instead of once), so a flag that silently did nothing
fails here. See docs/memory.md, "Gradient checkpointing"."""
import json

import pytest
import torch
from lightning.pytorch.callbacks import Callback

import tiny_task as task
from conftest import quiet_trainer
from layer_forwards import count_grad_forwards
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.model.loading import load_policy

GEN = dict(max_new_tokens=6, max_prompt_length=8)
LORA = dict(r=4, lora_alpha=8, target_modules="all-linear")
SETUPS = {"full": dict(kl_coef=0.2), "lora": dict(kl_coef=0.2, lora=LORA),
          "qlora": dict(kl_coef=0.2, lora=LORA, quantization="nf4")}
# fp32. The recompute runs the same kernels on the same inputs, so the gradients come out
# bit-equal (measured max difference 0.0 in every test here); the tolerance only leaves room for a
# kernel that would pick another reduction order on its second run.
ATOL, RTOL = 1e-7, 1e-6
# Micro-batches against one pass: the same terms summed in another order (tests/core/test_micro_batches.py).
MICRO_ATOL, MICRO_RTOL = 1e-6, 1e-4


class GradRecorder(Callback):
    """The gradients at every optimizer step (before the module would clip them)."""

    def __init__(self):
        self.steps = []

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.steps.append({n: p.grad.detach().clone() for n, p in module.policy.named_parameters() if p.grad is not None})


def _fit(model_dir, rows, checkpointing: bool, **kwargs):
    """One GRPO step; ``(gradients, grad-enabled forwards of layer 0, module)``. Both settings roll
    out the same completions (generation runs in eval mode, where checkpointing is off)."""
    module = RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, seed=5, seed_per_prompt=True,
                      generation=GEN, max_grad_norm=None, gradient_checkpointing=checkpointing, **kwargs)
    forwards, recorder = count_grad_forwards(module.policy), GradRecorder()
    quiet_trainer(max_steps=1, callbacks=[recorder]).fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    return recorder.steps, forwards[0], module


def _assert_same(a, b, atol=ATOL, rtol=RTOL):
    assert len(a) == len(b) == 1 and a[0]
    assert a[0].keys() == b[0].keys()
    assert any(g.abs().sum() > 0 for g in a[0].values()), "no gradient at all: the comparison would prove nothing"
    for name in a[0]:
        assert torch.allclose(a[0][name], b[0][name], atol=atol, rtol=rtol), \
            (name, (a[0][name] - b[0][name]).abs().max().item())


@pytest.mark.parametrize("setup", list(SETUPS))
def test_checkpointed_gradient_equals_plain_one_and_layers_are_recomputed(setup, warm_start_dir, arithmetic_rows):
    plain, plain_forwards, plain_module = _fit(warm_start_dir, arithmetic_rows, False, **SETUPS[setup])
    ckpt, ckpt_forwards, module = _fit(warm_start_dir, arithmetic_rows, True, **SETUPS[setup])
    assert module.policy.is_gradient_checkpointing and not plain_module.policy.is_gradient_checkpointing
    assert module.policy.training  # HF checkpoints only in train mode
    # One loss forward per step without checkpointing; with it, that forward plus its recompute.
    assert (plain_forwards, ckpt_forwards) == (1, 2)
    _assert_same(plain, ckpt)
    if setup != "full":
        assert all("lora_" in name for name in ckpt[0])  # only the adapters train


@pytest.mark.parametrize("setup", ["full", "lora"])
def test_checkpointing_with_micro_batches_equals_one_plain_pass(setup, warm_start_dir, arithmetic_rows):
    plain, plain_forwards, _ = _fit(warm_start_dir, arithmetic_rows, False, **SETUPS[setup])
    micro, micro_forwards, _ = _fit(warm_start_dir, arithmetic_rows, True, max_tokens_per_micro_batch=4 * 14,
                                    **SETUPS[setup])
    plain_micro, plain_micro_forwards, _ = _fit(warm_start_dir, arithmetic_rows, False,
                                                max_tokens_per_micro_batch=4 * 14, **SETUPS[setup])
    assert plain_forwards == 1 and plain_micro_forwards > 1, "the token cap did not cut the mini-batch"
    assert micro_forwards == 2 * plain_micro_forwards  # every micro-batch recomputed
    _assert_same(plain_micro, micro)  # same micro-batches, same summation order: checkpointing alone
    _assert_same(plain, micro, atol=MICRO_ATOL, rtol=MICRO_RTOL)


def _drop_input_grad_hooks(policy) -> None:
    """Remove the embedding forward hooks that make the embeddings' output require grad (put there
    by transformers' ``gradient_checkpointing_enable`` and again by peft when it wraps a checkpointed
    model; ``disable_input_require_grads`` removes only the last registered one)."""
    hooks = policy.get_input_embeddings()._forward_hooks
    for key in [k for k, fn in hooks.items() if "make_inputs_require_grad" in fn.__qualname__]:
        del hooks[key]


def _lora_grads(model_dir, quantization, checkpointing, reentrant=False, input_hooks=True):
    policy = load_policy(model_dir, lora=LORA, quantization=quantization, gradient_checkpointing=checkpointing, seed=3)
    policy.train()
    if reentrant:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    if not input_hooks:
        _drop_input_grad_hooks(policy)
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 2], [1, 4, 4, 3, 11, 12, 5, 6]])
    policy(input_ids=ids, labels=ids).loss.backward()
    return {n: p.grad for n, p in policy.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("quantization", [None, "nf4"])
def test_lora_needs_no_input_require_grads_with_non_reentrant_checkpointing(quantization, warm_start_dir):
    """peft's known issue: under *reentrant* checkpointing a layer whose inputs do not require grad
    (the frozen embeddings' output) gives its adapters no gradient, hence peft's and transformers'
    ``enable_input_require_grads``. The project checkpoints non-reentrantly, which needs no such
    hook: with every hook removed the adapters' gradients still equal the plain ones; reentrant
    checkpointing without them leaves nothing to differentiate."""
    plain = _lora_grads(warm_start_dir, quantization, checkpointing=False)
    no_hook = _lora_grads(warm_start_dir, quantization, checkpointing=True, input_hooks=False)
    assert plain.keys() == no_hook.keys() and all(g is not None for g in no_hook.values())
    for name in plain:
        assert torch.allclose(plain[name], no_hook[name], atol=ATOL, rtol=RTOL), name
    with pytest.raises(RuntimeError, match="does not require grad"):
        _lora_grads(warm_start_dir, quantization, checkpointing=True, reentrant=True, input_hooks=False)


@pytest.mark.slow
def test_fsdp2_with_checkpointing_trains_like_without(tmp_path):
    """Two gloo processes under ModelParallelStrategy (FSDP2 shards each decoder layer, then the
    policy, after HF enabled checkpointing): two steps give the same metrics and weights with
    checkpointing as without, and each rank did recompute its layers."""
    from test_distributed import _run  # the launcher of tests/scripts/distributed_fit.py

    plain_rows, plain = _run("fsdp2", tmp_path / "plain", "--steps", "2")
    ckpt_rows, ckpt = _run("fsdp2", tmp_path / "ckpt", "--steps", "2", "--gradient-checkpointing")
    for rank in (0, 1):
        forwards = [json.load(open(tmp_path / run / f"layer_forwards_rank{rank}.json")) for run in ("plain", "ckpt")]
        assert forwards == [2, 4], f"rank {rank}: grad-enabled forwards of layer 0 {forwards}"
    assert len(plain_rows) == len(ckpt_rows) == 2
    for a, b in zip(plain_rows, ckpt_rows):
        assert a == pytest.approx(b, rel=RTOL, abs=ATOL)
    for key in plain:
        assert torch.allclose(plain[key], ckpt[key], atol=ATOL, rtol=RTOL), key
