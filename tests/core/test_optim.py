"""Optimizer and schedule as callables (`RLModule(optimizer=..., lr_scheduler=...)`): the schedule's
values by hand and against transformers', the callables taking effect in a fit (SGD steps of twice
the learning rate move the weights twice as far; the scheduler steps once per optimizer step and
resumes exactly), bitsandbytes' 8-bit AdamW training on CPU, and every bad input refused at
construction or fit start, before a rollout. The CLI's schedule is checked in tests/cli/test_cli.py."""
import functools
import pickle

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.optim import WarmupCosineLR
from resume_utils import assert_same_run, straight_and_resumed

GEN = dict(max_new_tokens=4, max_prompt_length=8)


def _module(path, **kwargs):
    kwargs.setdefault("max_grad_norm", None)
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, generation=GEN, seed=0, **kwargs)


def _weights(module):
    return {n: p.detach().clone() for n, p in module.policy.named_parameters()}


def _lrs(scheduler_factory, steps, base=1.0):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    sched = scheduler_factory(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_cosine_values_by_hand():
    # warm-up 2: 0, 1/2; then p = (s - 2) / 4 with floor 0.1: 0.1 + 0.9 · ½(1 + cos πp)
    lrs = _lrs(functools.partial(WarmupCosineLR, total_steps=6, warmup_steps=2, min_lr_ratio=0.1), 9)
    expected = [0.0, 0.5, 1.0, 0.1 + 0.9 * 0.5 * (1 + 2 ** -0.5), 0.55, 0.1 + 0.9 * 0.5 * (1 - 2 ** -0.5), 0.1, 0.1, 0.1]
    assert lrs == pytest.approx(expected, abs=1e-12)


def test_warmup_cosine_equals_transformers_schedule_up_to_total_steps():
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    ours = _lrs(functools.partial(WarmupCosineLR, total_steps=50, warmup_steps=7, min_lr_ratio=0.2), 51, base=3e-5)
    theirs = _lrs(lambda opt: get_cosine_with_min_lr_schedule_with_warmup(opt, 7, 50, min_lr_rate=0.2), 51, base=3e-5)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15)


def test_sgd_callable_takes_effect_and_its_step_scales_with_its_learning_rate(warm_start_dir, arithmetic_rows):
    """One rollout, one optimizer step of SGD without clipping: the update is -lr · g, so lr 0.2
    moves every weight exactly twice as far as lr 0.1 (same seed, same rollout, same gradient)."""
    moves = []
    for lr in (0.1, 0.2):
        module = _module(warm_start_dir, optimizer=functools.partial(torch.optim.SGD, lr=lr))
        before = _weights(module)
        trainer = quiet_trainer(max_steps=1)
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=8))
        assert type(trainer.optimizers[0]) is torch.optim.SGD
        after = _weights(module)
        moves.append(torch.cat([(after[k] - before[k]).flatten() for k in before]))
    assert moves[0].abs().max() > 0
    torch.testing.assert_close(moves[1], 2 * moves[0], atol=3e-7, rtol=0)  # ~2 ulp of a weight near 1


def test_scheduler_steps_once_per_optimizer_step_and_monitor_logs_it(warm_start_dir, arithmetic_rows, tmp_path):
    """μ = 2 passes × 2 mini-batches of 16: 4 optimizer steps per batch; LinearLR over 8 steps from 1 to 0."""
    from lightning.pytorch.loggers import CSVLogger

    sched = functools.partial(torch.optim.lr_scheduler.LinearLR, start_factor=1.0, end_factor=0.0, total_iters=8)
    module = _module(warm_start_dir, lr=0.01, lr_scheduler=sched, updates_per_rollout=2, minibatch_size=16)
    logger = CSVLogger(str(tmp_path))
    trainer = quiet_trainer(max_steps=8, logger=logger, callbacks=[LearningRateMonitor(logging_interval="step")])
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=8))
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == 8 == trainer.global_step
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    import csv
    with open(f"{logger.log_dir}/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = {int(r["step"]): float(r["lr-AdamW"]) for r in rows if r.get("lr-AdamW")}
    own = {int(r["step"]): float(r["learning_rate"]) for r in rows if r.get("learning_rate")}
    # logged at the start of each batch, under the count of batches (Lightning's logging step): the
    # rate the batch's first optimizer step used (steps 0 and 4); the module's own learning_rate, under
    # the same step, is the rate of the batch's last (steps 3 and 7), as TRL's
    assert logged == pytest.approx({0: 0.01, 1: 0.01 * (1 - 4 / 8)})
    assert own == pytest.approx({0: 0.01 * (1 - 3 / 8), 1: 0.01 * (1 - 7 / 8)})


def test_schedule_resumes_exactly(tmp_path, warm_start_dir, arithmetic_rows):
    sched = functools.partial(WarmupCosineLR, total_steps=8, warmup_steps=2, min_lr_ratio=0.1)
    straight, resumed = straight_and_resumed(
        tmp_path, lambda: _module(warm_start_dir, lr=1e-3, lr_scheduler=sched),
        lambda: PromptDataModule(arithmetic_rows, batch_size=4, seed=1),
        make_callbacks=lambda: [LearningRateMonitor(logging_interval="step")], n=2)
    assert_same_run(straight, resumed)
    assert straight[0][3]["lr-AdamW"] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi / 6)).item())))


def test_the_default_adamw_is_fused_as_transformers_default_is_and_steps_as_the_unfused_one(warm_start_dir, arithmetic_rows,
                                                                                           tmp_path):
    """transformers (torch >= 2.8) gives TRL's trainers ``adamw_torch_fused``; ours is fused too, in a
    fit, and its steps equal torch's unfused AdamW's up to rounding. Parameters the kernel does not
    take (``meta``, as at construction) get torch's default instead."""
    from transformers import TrainingArguments

    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    from lightning_rlpt.optim import default_optimizer, for_precision

    assert TrainingArguments(output_dir=str(tmp_path)).optim == "adamw_torch_fused"
    module = _module(warm_start_dir, lr=1e-3)
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=8))
    assert type(trainer.optimizers[0]) is torch.optim.AdamW and trainer.optimizers[0].defaults["fused"] is True

    torch.manual_seed(0)
    ours, theirs = (torch.nn.Parameter(torch.randn(64, 300)) for _ in range(2))
    theirs.data.copy_(ours.data)
    opts = (default_optimizer(lr=1e-2, weight_decay=0.1)([ours]),
            torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1, foreach=False))
    for _ in range(5):
        grad = torch.randn(64, 300)
        for p, opt in zip((ours, theirs), opts):
            p.grad = grad.clone()
            opt.step()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert default_optimizer()([torch.nn.Parameter(torch.zeros(2, device="meta"))]).defaults["fused"] is None
    # Lightning's MixedPrecision refuses gradient clipping with a fused optimizer: unfused there (a bf16-mixed fit
    # with clipping: tests/model/test_precision.py); a user's own factory is never changed
    mixed, params = MixedPrecision("bf16-mixed", "cpu"), [torch.nn.Parameter(torch.zeros(2))]
    assert for_precision(default_optimizer(), mixed)(params).defaults["fused"] is None
    assert for_precision(default_optimizer(), Precision())(params).defaults["fused"] is True
    own = functools.partial(torch.optim.AdamW, fused=True)
    assert for_precision(own, mixed) is own
    # it pickles, as the partial it replaced did (ddp_spawn pickles the module and its factory)
    assert pickle.loads(pickle.dumps(for_precision(default_optimizer(), mixed)))(params).defaults["fused"] is None


def test_bitsandbytes_8bit_adamw_trains_on_cpu(warm_start_dir, arithmetic_rows):
    import bitsandbytes as bnb

    module = _module(warm_start_dir, optimizer=functools.partial(bnb.optim.AdamW8bit, lr=1e-3))
    before = _weights(module)
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=8))
    assert type(trainer.optimizers[0]) is bnb.optim.AdamW8bit
    state = trainer.optimizers[0].state[module.policy.model.layers[0].self_attn.q_proj.weight]
    assert state["state1"].dtype == torch.uint8  # 8-bit moments (bitsandbytes keeps them from 4,096 elements)
    after = _weights(module)
    assert any(not torch.equal(before[k], after[k]) for k in before)


# ---------------------------------------------------------------- bad input
def test_paged_optimizer_on_cpu_is_refused_at_fit_start_naming_the_unpaged_one(warm_start_dir, arithmetic_rows):
    import bitsandbytes as bnb

    module = _module(warm_start_dir, optimizer=functools.partial(bnb.optim.PagedAdamW8bit, lr=1e-3))  # CPU params at init
    trainer = quiet_trainer(max_steps=1)
    with pytest.raises(ValueError, match=r"PagedAdamW8bit pages optimizer state.*on cpu.*bitsandbytes.optim.AdamW8bit"):
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=8))
    assert module.policy_version == 0  # refused before any rollout or step


@pytest.mark.parametrize("factory, message", [
    (lambda: None, r"lr_scheduler .* could not be called with the optimizer.*functools.partial"),
    (functools.partial(torch.optim.lr_scheduler.StepLR), r"could not be called with the optimizer.*step_size"),
    (functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau), r"ReduceLROnPlateau steps on a monitored metric"),
    (lambda opt: opt, r"returned SGD, not a torch.optim.lr_scheduler.LRScheduler"),
    ("cosine", r"lr_scheduler must be a callable"),
])
def test_bad_scheduler_is_refused_at_construction(llama_dir, factory, message):
    with pytest.raises((TypeError, ValueError), match=message):
        _module(llama_dir, optimizer=functools.partial(torch.optim.SGD, lr=0.1), lr_scheduler=factory)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(optimizer=lambda: None), TypeError, r"could not be called with the parameters"),
    (dict(optimizer=lambda params: "adam"), TypeError, r"returned str, not a torch.optim.Optimizer"),
    (dict(optimizer=functools.partial(torch.optim.SGD, lr=0.1), lr=0.5), ValueError,
     r"\['lr'\] configure the default AdamW, and optimizer= was given too"),
    (dict(lr=0.0), ValueError, r"lr must be > 0"),
])
def test_bad_optimizer_arguments_are_refused_at_construction(llama_dir, kwargs, error, message):
    with pytest.raises(error, match=message):
        _module(llama_dir, **kwargs)
