"""The Trainer's own optimization knobs on an `RLModule` (manual optimization): ``gradient_clip_val``
is honoured as ``max_grad_norm``; ``accumulate_grad_batches``, ``gradient_clip_algorithm="value"``
and a clip value contradicting the module's are refused with errors naming the right knob, before
any rollout, instead of Lightning's advice to switch to automatic optimization."""
import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule


class NormRecordingSGD(torch.optim.SGD):
    """SGD that records the global gradient norm it steps with: Lightning's precision plugin
    passes a closure that runs ``on_before_optimizer_step`` (the clipping), so run it first."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.norms: list[float] = []

    def step(self, closure=None):
        if closure is not None:
            with torch.enable_grad():
                closure()
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return super().step()


def _module(warm_start_dir, **kwargs):
    return RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4,
                    generation=dict(max_new_tokens=4, max_prompt_length=8), **kwargs)


def _fit(module, rows, **trainer_kwargs):
    trainer = quiet_trainer(max_steps=2, **trainer_kwargs)
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    return trainer


def test_gradient_clip_val_clips_the_global_norm_as_max_grad_norm(warm_start_dir, arithmetic_rows):
    optimizers = []

    def sgd(params):
        optimizers.append(NormRecordingSGD(params, lr=1e-3))
        return optimizers[-1]

    module = _module(warm_start_dir, optimizer=sgd)  # max_grad_norm left at its default
    trainer = _fit(module, arithmetic_rows, gradient_clip_val=1e-4)
    assert trainer.global_step == 2 and module.hparams.max_grad_norm == 1e-4
    stepped = optimizers[-1].norms
    assert len(stepped) == 2 and all(0 < n <= 1e-4 * (1 + 1e-4) for n in stepped)  # clipped to 1e-4
    assert module._grad_norm > 1e-4  # the unclipped norm (logged as grad_norm) was above it


BY_VALUE = r"gradient_clip_algorithm='value'.*max_grad_norm"


@pytest.mark.parametrize("trainer_kwargs, module_kwargs, expected", [
    (dict(accumulate_grad_batches=2), {}, r"accumulate_grad_batches=2.*minibatch_size.*micro_batch_size"),
    (dict(gradient_clip_val=0.5, gradient_clip_algorithm="value"), {}, BY_VALUE),
    (dict(gradient_clip_algorithm="value"), {}, BY_VALUE),
    (dict(gradient_clip_val=0.5), dict(max_grad_norm=2.0), r"gradient_clip_val=0.5.*max_grad_norm=2.0.*disagree"),
], ids=["accumulate", "clip-by-value", "value-algorithm-alone", "two-clip-values"])
def test_unsupported_trainer_knobs_fail_naming_the_module_knob(trainer_kwargs, module_kwargs, expected,
                                                              warm_start_dir, arithmetic_rows):
    module = _module(warm_start_dir, **module_kwargs)
    with pytest.raises(ValueError, match=expected):
        _fit(module, arithmetic_rows, **trainer_kwargs)
    assert module.policy_version == 0  # refused before any rollout
