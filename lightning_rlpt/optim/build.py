"""Building the optimizer and the scheduler from the callables `RLModule` was given, with the
checks that turn a wrong callable or an unsupported 8-bit optimizer into a clear error at
construction, before any model is rolled out."""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], LRScheduler]


def default_optimizer(lr: float = 1e-6, weight_decay: float = 0.0,
                      betas: tuple[float, float] = (0.9, 0.999)) -> OptimizerFactory:
    """AdamW with a constant learning rate: what `RLModule` uses without ``optimizer=``.

    Fused (``fused=True``: one kernel per dtype and device, no temporaries the size of a
    parameter) wherever every parameter allows it, as transformers' default ``adamw_torch_fused``
    is for TRL (FSDP2's DTensors included: the kernel is pointwise on their shards); otherwise (a
    device without the kernel, or ``fused=False``: `for_precision`) torch's default.
    The same update either way, up to rounding.

    Examples:
        >>> opt = default_optimizer(lr=3e-5)([torch.nn.Parameter(torch.zeros(1))])
        >>> opt.defaults["lr"], opt.defaults["fused"]
        (3e-05, True)
    """
    # a partial of a module-level function, as before: it pickles (ddp_spawn, deepcopy)
    return functools.partial(adamw, lr=lr, weight_decay=weight_decay, betas=tuple(betas))


def adamw(params: Iterable[torch.nn.Parameter], fused: bool | None = None, **kwargs: Any) -> torch.optim.Optimizer:
    """`default_optimizer`'s AdamW: fused when ``fused`` is None and `fusable` says so."""
    params = list(params)
    fused = fusable(params) if fused is None else fused
    return torch.optim.AdamW(params, fused=fused or None, **kwargs)


def for_precision(factory: OptimizerFactory, precision_plugin: Any) -> OptimizerFactory:
    """``factory``, with the default AdamW unfused under Lightning's ``MixedPrecision`` plugin
    (``16-mixed``, ``bf16-mixed``): it refuses gradient clipping with an optimizer that unscales
    its own gradients, as fused AdamW does. A user's own factory is left as it is."""
    from lightning.pytorch.plugins.precision import MixedPrecision
    if getattr(factory, "func", None) is adamw and isinstance(precision_plugin, MixedPrecision):
        return functools.partial(factory, fused=False)
    return factory


def fusable(params: list[torch.nn.Parameter]) -> bool:
    """Whether torch's fused AdamW takes every one of ``params``: floating-point tensors on a device
    with the fused kernel (not ``meta``, as before the strategy moves them)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    devices = _get_fused_kernels_supported_devices()
    return bool(params) and all(p.is_floating_point() and p.device.type in devices
                                for p in params)


def optimizer_factory(optimizer: OptimizerFactory | None, lr: float | None, weight_decay: float | None,
                      betas: tuple[float, float] | None) -> OptimizerFactory:
    """`RLModule`'s ``optimizer=`` callable, or the default AdamW from ``lr`` / ``weight_decay`` /
    ``betas``; giving both is refused, since the callable would silently ignore the numbers."""
    given = {k: v for k, v in dict(lr=lr, weight_decay=weight_decay, betas=betas).items() if v is not None}
    if optimizer is None:
        return default_optimizer(**given)
    if given:
        raise ValueError(f"{sorted(given)} configure the default AdamW, and optimizer= was given too: set them in "
                         "the optimizer callable (e.g. functools.partial(torch.optim.AdamW, lr=1e-6), or the "
                         "config's optimizer.init_args) and drop them here")
    return optimizer


def check_update_numbers(mu: int, minibatch: int | None, val_samples: int, lr: float | None) -> None:
    """`RLModule`'s update counts and learning rate, checked at construction."""
    if lr is not None and not lr > 0:
        raise ValueError(f"lr must be > 0 (got {lr}); to evaluate without training use trainer.validate")
    if mu < 1:
        raise ValueError(f"updates_per_rollout must be >= 1 (got {mu})")
    if minibatch is not None and minibatch < 1:
        raise ValueError(f"minibatch_size must be >= 1 or None (got {minibatch})")
    if val_samples < 1:
        raise ValueError(f"val_samples must be >= 1 (got {val_samples})")


def _name(factory: Any) -> str:
    inner = getattr(factory, "func", factory)
    return f"{getattr(inner, '__module__', '')}.{getattr(inner, '__qualname__', repr(inner))}".lstrip(".")


def _call(factory: Any, arg: Any, what: str, takes: str, example: str, returns: type) -> Any:
    """``factory(arg)``, with an error that names the argument and shows a callable that works
    when ``factory`` is not callable, does not take ``arg``, or returns something else."""
    if not callable(factory):
        raise TypeError(f"{what} must be a callable that takes the {takes}, got {factory!r}: pass e.g. {example}")
    try:
        built = factory(arg)
    except TypeError as err:
        raise TypeError(f"{what} {_name(factory)} could not be called with the {takes}: {err}. Pass a callable "
                        f"whose other arguments are bound, e.g. {example}") from err
    if not isinstance(built, returns):
        raise TypeError(f"{what} {_name(factory)} returned {type(built).__name__}, not a "
                        f"{'torch.optim' if returns is torch.optim.Optimizer else 'torch.optim.lr_scheduler'}.{returns.__name__}")
    return built


def build_optimizer(factory: OptimizerFactory, params: list[torch.nn.Parameter],
                    check_device: bool = True) -> torch.optim.Optimizer:
    """``factory(params)``, checked: it must accept the parameters and return an optimizer that
    can step on their device (`check_bitsandbytes`; skipped with ``check_device=False``, as when
    `RLModule` tries its callables at construction, before the strategy moves the parameters)."""
    optimizer = _call(factory, params, "optimizer", "parameters",
                      "functools.partial(torch.optim.AdamW, lr=1e-6), or in a config a class_path with init_args",
                      torch.optim.Optimizer)
    if check_device:
        check_bitsandbytes(optimizer, params[0])
    return optimizer


def check_bitsandbytes(optimizer: torch.optim.Optimizer, sample: torch.Tensor) -> None:
    """Refuse a bitsandbytes optimizer the platform cannot run as asked, before training starts.

    A paged optimizer pages its state between GPU and CPU memory; on any other device bitsandbytes
    only warns and falls back to the unpaged optimizer, so a run that asked for paging silently
    gets none: refused. Any other bitsandbytes optimizer takes one probe step on a 4,096-element
    parameter (the size from which bitsandbytes keeps 8-bit state) of ``sample``'s device and
    dtype; a build without support for them fails there, not at the first real step."""
    cls = type(optimizer)
    if not cls.__module__.startswith("bitsandbytes"):
        return
    device = sample.device
    if cls.__name__.startswith("Paged") and device.type != "cuda":
        unpaged = cls.__name__[len("Paged"):]
        raise ValueError(f"bitsandbytes' {cls.__name__} pages optimizer state out of GPU memory, and the parameters "
                         f"are on {device.type}, where bitsandbytes does not page (it would fall back to {unpaged}). "
                         f"Use bitsandbytes.optim.{unpaged} (8-bit state, no paging) or torch.optim.AdamW here, or "
                         "train on a CUDA GPU")
    probe = torch.nn.Parameter(torch.zeros(4096, device=device, dtype=sample.dtype))
    try:
        probe.grad = torch.ones_like(probe)
        cls([probe], lr=1e-3).step()
    except Exception as err:
        raise RuntimeError(f"bitsandbytes' {cls.__name__} cannot step {sample.dtype} parameters on {device} with this "
                           f"bitsandbytes build ({type(err).__name__}: {err}). Use torch.optim.AdamW (32-bit state; "
                           "fused=True on CUDA), or install a bitsandbytes build that supports this device") from err


def build_scheduler(factory: SchedulerFactory | None, optimizer: torch.optim.Optimizer,
                    steps: int | None | bool = False) -> LRScheduler | None:
    """``factory(optimizer)``, checked: it must take the optimizer and return a scheduler that
    steps without a monitored metric (`RLModule` steps it after every optimizer step).

    Args:
        factory: the ``lr_scheduler`` callable, or None (no scheduler).
        optimizer: what it schedules.
        steps: the run's optimizer steps (`run_steps`; None: unknown), given to a schedule that
            fits itself to the run (``fit_to``: `WarmupCosineLR`, `WarmupLinearLR`); False (at
            construction, before there is a run): not yet.
    """
    if factory is None:
        return None
    scheduler = _call(factory, optimizer, "lr_scheduler", "optimizer",
                      "functools.partial(lightning_rlpt.optim.WarmupLinearLR, warmup_steps=10)", LRScheduler)
    if isinstance(scheduler, ReduceLROnPlateau):
        raise ValueError("ReduceLROnPlateau steps on a monitored metric, and RLModule steps its scheduler after every "
                         "optimizer step without one: use a step-based schedule (LinearLR, CosineAnnealingLR, "
                         "lightning_rlpt.optim.WarmupLinearLR or WarmupCosineLR)")
    if steps is not False and hasattr(scheduler, "fit_to"):
        scheduler.fit_to(steps)
    return scheduler


class RunSteps(int):
    """A run's optimizer steps that are only an upper bound: ``why`` says what may end it first."""

    def __new__(cls, steps: int, why: str) -> "RunSteps":
        out = super().__new__(cls, steps)
        out.why = why
        return out


def run_steps(trainer: Any, updates_per_rollout: int, minibatch_size: int | None) -> int | None:
    """The optimizer steps a fit will take (None: unknown): the Trainer's ``max_steps`` (which
    counts optimizer steps under manual optimization), or fewer when its epochs end first.

    Lightning's ``estimated_stepping_batches`` counts training batches, and each batch (one
    rollout) takes ``updates_per_rollout`` optimizer steps when it is one mini-batch; with
    ``minibatch_size`` the count per rollout depends on the rollout's rows, so only ``max_steps``
    bounds the run: when the epochs may end before it, the count is a `RunSteps` that says so
    (a schedule fitted to it warns). An endless run (no ``max_steps``, ``max_epochs=-1``) is
    unknown too.

    Args:
        trainer: the fitting Trainer.
        updates_per_rollout / minibatch_size: `RLModule`'s.
    """
    max_steps = None if trainer.max_steps == -1 else trainer.max_steps
    if trainer.max_epochs == -1:
        return max_steps
    batches = trainer.estimated_stepping_batches  # min(batches × epochs, max_steps), in batches
    if math.isinf(batches):
        return max_steps
    if minibatch_size is not None:
        if max_steps is None or int(batches) * updates_per_rollout >= max_steps:  # max_steps surely ends it
            return max_steps
        return RunSteps(max_steps, f"the {trainer.max_epochs} epochs ({int(batches)} rollouts) may end first: with "
                                   "minibatch_size the optimizer steps per rollout depend on each rollout's rows")
    steps = int(batches) * updates_per_rollout
    return steps if max_steps is None else min(steps, max_steps)
