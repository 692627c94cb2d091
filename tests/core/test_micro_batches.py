"""Micro-batches inside one optimizer step: the accumulated gradient is the one-pass gradient
for every aggregation mode, with and without KL, for full fine-tuning and LoRA; the chunked
no-grad forwards equal one pass; the budget's bad inputs fail before any rollout."""
import pytest
import torch
from lightning.pytorch.callbacks import Callback

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.batching import MicroBatching, logprobs_in_chunks
from lightning_rlpt.rewards import score_experience
from lightning_rlpt.rollout import collect

GEN = dict(max_new_tokens=6, max_prompt_length=8)
AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
# fp32: the micro-batched gradient sums the same terms in another order.
ATOL, RTOL = 1e-6, 1e-4


class GradRecorder(Callback):
    """The gradients at every optimizer step (Lightning calls this before the module clips)."""

    def __init__(self):
        self.steps = []

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.steps.append({n: p.grad.detach().clone() for n, p in module.policy.named_parameters() if p.grad is not None})


def _grads(model_dir, rows, steps=1, **kwargs):
    # Each row samples from its own seed and the caps never chunk generation: both runs train on
    # the same rollout (tests/rollout/sampling/test_per_row.py).
    if "optimizer" not in kwargs:
        kwargs["lr"] = 1e-3
    module = RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, seed=5, seed_per_prompt=True,
                      generation=GEN, max_grad_norm=None, **kwargs)
    recorder = GradRecorder()
    quiet_trainer(max_steps=steps, callbacks=[recorder]).fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    return recorder.steps, module


def _rollout(module, rows):
    batch = dict(prompt=[r["prompt"] for r in rows], answer=[r["answer"] for r in rows])
    exp, _ = collect.rollout(module.engine, module.tokenizer, batch, module.group_size, module.sampling, 1, "cpu")
    score_experience(exp, module.rewards)
    return exp


def _assert_same(a, b):
    assert len(a) == len(b) and a
    for step_a, step_b in zip(a, b):
        assert step_a.keys() == step_b.keys()
        for name in step_a:
            assert torch.allclose(step_a[name], step_b[name], atol=ATOL, rtol=RTOL), \
                (name, (step_a[name] - step_b[name]).abs().max().item())


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl_coef", [0.0, 0.2])
def test_micro_batched_gradient_equals_one_pass_full_fine_tuning(warm_start_dir, arithmetic_rows, aggregation, kl_coef):
    args = dict(loss_aggregation=aggregation, kl_coef=kl_coef)
    one_pass, _ = _grads(warm_start_dir, arithmetic_rows, **args)
    by_rows, _ = _grads(warm_start_dir, arithmetic_rows, micro_batch_size=4, **args)
    by_tokens, _ = _grads(warm_start_dir, arithmetic_rows, max_tokens_per_micro_batch=4 * 14, **args)
    _assert_same(one_pass, by_rows)
    _assert_same(one_pass, by_tokens)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batched_gradient_equals_one_pass_lora(warm_start_dir, arithmetic_rows, aggregation):
    args = dict(loss_aggregation=aggregation, kl_coef=0.2, lora=dict(r=4, lora_alpha=8, target_modules="all-linear"))
    one_pass, _ = _grads(warm_start_dir, arithmetic_rows, **args)
    micro, _ = _grads(warm_start_dir, arithmetic_rows, micro_batch_size=4, **args)  # 4: one generate call per group
    _assert_same(one_pass, micro)


def test_micro_batches_with_several_minibatches_and_reuse_match_one_pass(warm_start_dir, arithmetic_rows):
    """μ = 2 passes of 2 mini-batches: four steps, each micro-batched; old log-probs chunked too."""
    args = dict(updates_per_rollout=2, minibatch_size=8, kl_coef=0.1)
    one_pass, _ = _grads(warm_start_dir, arithmetic_rows, **args)
    micro, _ = _grads(warm_start_dir, arithmetic_rows, micro_batch_size=4, **args)  # 4: one generate call per group
    assert len(one_pass) == 4
    _assert_same(one_pass, micro)


def test_token_budget_groups_rows_by_length_and_trims_each_micro_batch(warm_start_dir, arithmetic_rows):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, seed=5, generation=GEN,
                      max_tokens_per_micro_batch=40)
    exp = _rollout(module, arithmetic_rows[:4])
    chunks = module.micro_batching.split(exp)
    assert sorted(torch.cat(chunks).tolist()) == list(range(len(exp)))  # every row exactly once
    for rows in chunks:
        micro = exp.select(rows).trim()
        assert micro.input_ids.numel() <= 40
        assert micro.prompt_mask[:, 0].any() and micro.completion_mask[:, -1].any()  # no all-padding column
    # Grouping by length: no micro-batch could have taken the next one's first row without busting the budget.
    lengths = exp.prompt_mask.sum(1) + exp.completion_mask.sum(1)
    assert [lengths[c].max() for c in chunks] == sorted([lengths[c].max() for c in chunks], reverse=True)


def test_chunked_reference_and_old_logprobs_equal_one_pass(warm_start_dir, arithmetic_rows):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, seed=5, generation=GEN)
    exp = _rollout(module, arithmetic_rows[:4])
    with torch.no_grad():
        whole, whole_ent = module._logprobs(module.policy, exp, with_entropy=True)
        chunks, chunk_ent = logprobs_in_chunks(lambda e: module._logprobs(module.policy, e, with_entropy=True), exp,
                                               MicroBatching(micro_batch_size=3))
    mask = exp.completion_mask.bool()
    assert torch.allclose(whole[mask], chunks[mask], atol=1e-5)
    assert torch.allclose(whole_ent[mask], chunk_ent[mask], atol=1e-5)
    # past a row's end: 0, or the padding's value when a longer row shares the chunk (masked out either way)
    assert ((chunks[~mask] == 0) | torch.isclose(chunks[~mask], whole[~mask], atol=1e-5)).all()


def test_hf_generation_has_its_own_cap_and_keeps_every_row(warm_start_dir, arithmetic_rows):
    """The training cap never chunks generation (small chunks re-read the model at every step);
    ``generation=dict(max_batch_rows=...)`` does."""
    calls = []
    for generation, expected in ((GEN, [8]), ({**GEN, "max_batch_rows": 3}, [3, 3, 2])):
        module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, seed=5,
                          generation=generation, micro_batch_size=3)
        original = module.engine._generate
        module.engine._generate = lambda rows, sampling, seeds, run=original: calls.append(len(rows)) or run(
            rows, sampling, seeds)
        exp = _rollout(module, arithmetic_rows[:2])
        assert calls == expected and len(exp) == 8
        calls.clear()


@pytest.mark.parametrize("name", ["micro_batch_size", "max_tokens_per_micro_batch"])
@pytest.mark.parametrize("value", [0, -2, 1.5])
def test_caps_below_one_are_refused(warm_start_dir, name, value):
    with pytest.raises(ValueError, match=f"{name} must be an integer >= 1"):
        RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, generation=GEN, **{name: value})


def test_budget_below_max_new_tokens_is_refused_at_construction(warm_start_dir):
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=5 is smaller than the longest sequence"):
        RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, generation=GEN,
                 max_tokens_per_micro_batch=5)


def test_prompt_too_long_for_the_budget_is_refused_before_its_rollout(warm_start_dir, arithmetic_rows):
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, generation=GEN,
                      max_tokens_per_micro_batch=9)
    calls = []
    module.engine.generate = lambda *a, **k: calls.append(1)
    with pytest.raises(ValueError, match=r"prompt \+ max_new_tokens=6 = .*Raise max_tokens_per_micro_batch to at least"):
        quiet_trainer(max_steps=1).fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    assert calls == []  # nothing generated


def test_gradients_are_freed_after_each_optimizer_step(warm_start_dir, arithmetic_rows):
    """Between optimizer steps no gradient is held (one copy of the weights less at rest); the
    recorder still sees every gradient just before the step."""
    class AfterStep(Callback):
        held = []

        def on_train_batch_end(self, trainer, module, *args):
            self.held.append(sum(p.grad is not None for p in module.policy.parameters()))

    after = AfterStep()
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, seed=5, generation=GEN,
                      micro_batch_size=4, updates_per_rollout=2)
    recorder = GradRecorder()
    quiet_trainer(max_steps=4, callbacks=[recorder, after]).fit(module, datamodule=PromptDataModule(arithmetic_rows,
                                                                                                    batch_size=4))
    assert len(recorder.steps) == 4 and all(recorder.steps)  # two rollouts, μ = 2: four optimizer steps (max_steps)
    assert after.held == [0, 0]
