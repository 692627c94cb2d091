"""Lightning's ``Trainer(precision=...)`` as this package reads it.

Lightning (2.6) applies the precision to the whole `RLModule`, so the policy and the frozen
reference of a full fine-tune follow it together:

- ``"bf16-true"`` / ``"16-true"``: the precision plugin's ``convert_module`` casts every
  parameter and buffer to bf16 / fp16 when the strategy sets up, *after* the ``setup`` hooks:
  `VLLMRollout`, which starts its engine in ``setup``, reads the dtype from the trainer
  (`precision_dtype`), not from the still-fp32 policy.
- ``"bf16-mixed"`` / ``"16-mixed"``: parameters stay fp32 (the optimizer updates fp32 master
  weights); ``training_step`` (rollout, log-probs, loss and backward) and ``validation_step``
  run under ``torch.autocast``.

Log-softmax runs in fp32 either way: the fused kernel accumulates in fp32 with autocast off
inside it, the plain path casts the logits to fp32 first; the loss is fp32.

`check_cpu_precision` refuses, before any rollout, fp16 on CPU: PyTorch has no fp16 autocast on
CPU (Lightning itself turns ``"16-mixed"`` on a CPU accelerator into ``"bf16-mixed"`` with a
warning), and a ``"16-true"`` fit on CPU died in its first rollout (``probability tensor contains
either inf, nan or element < 0``). It refuses bf16 on a CPU without bf16 instructions
(``avx512_bf16`` / ``amx_bf16`` on x86, ``bf16`` on Arm, read from ``/proc/cpuinfo``): PyTorch
then converts every bf16 product to fp32 and back, slower than fp32 and rounded like bf16, the
worst of both; ``LIGHTNING_RLPT_ALLOW_SLOW_BF16=1`` runs it anyway (the test suite sets it: its bf16
cases check correctness, not speed). Where ``/proc/cpuinfo`` cannot be read the CPU is not judged.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from typing import Any

import torch

_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16}
# Set to "1" to run bf16 on a CPU without bf16 instructions anyway (correct, only slow).
ALLOW_SLOW_BF16 = "LIGHTNING_RLPT_ALLOW_SLOW_BF16"


def precision_dtype(precision: Any) -> torch.dtype | None:
    """The compute dtype a Trainer precision implies: bf16 for ``"bf16-true"``/``"bf16-mixed"``,
    fp16 for ``"16-true"``/``"16-mixed"``, None otherwise (the model's own dtype).

    Examples:
        >>> precision_dtype("bf16-mixed"), precision_dtype("32-true")
        (torch.bfloat16, None)
    """
    return _DTYPES.get(str(precision).split("-")[0])


def cpu_bf16_flags(path: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's bf16 instruction flags (empty: none), or None when ``path`` cannot be read."""
    try:
        with open(path) as f:
            words = {w for line in f if line.startswith(("flags", "Features")) for w in line.split()}
    except OSError:
        return None
    return words & {"avx512_bf16", "amx_bf16", "bf16"}


def check_cpu_precision(trainer: Any) -> None:
    """Fail before any rollout when the run would compute in fp16 on a CPU, or in bf16 on a CPU
    without bf16 instructions."""
    precision = str(trainer.precision)
    if trainer.strategy.root_device.type != "cpu":
        return
    if precision_dtype(precision) == torch.bfloat16 and cpu_bf16_flags() == set() \
            and os.environ.get(ALLOW_SLOW_BF16) != "1":
        raise ValueError(
            f"precision={precision!r} computes in bfloat16, and this CPU has no bf16 instructions (none of "
            "avx512_bf16, amx_bf16 (x86) or bf16 (Arm) in /proc/cpuinfo): PyTorch would convert every bf16 product to fp32 and "
            "back, slower than fp32 and rounded like bf16. Use precision='32-true' here, or a CPU (or GPU) with "
            f"bf16 support; {ALLOW_SLOW_BF16}=1 runs it anyway (e.g. to test a bf16 setup on a laptop)")
    if precision_dtype(precision) == torch.float16:
        raise ValueError(
            f"precision={precision!r} computes in float16 on CPU, which is not supported: PyTorch has no fp16 "
            "autocast on CPU, and fp16 weights there gave NaN sampling probabilities in the first rollout. Use "
            "precision='bf16-mixed' (fp32 weights, bf16 compute) or 'bf16-true' (bf16 weights), or a GPU")


def lost_update_fraction(params: Iterable[torch.Tensor], lr: float, dtype: torch.dtype) -> float:
    """Share of the weights an optimizer step of size ``lr`` cannot move once stored in ``dtype``.

    Rounding to nearest drops an update smaller than half a unit in the last place, which for a
    weight ``w`` is more than ``|w| · eps / 4``; so a step of about ``lr`` (AdamW's size) is surely
    lost wherever ``|w| > 4 · lr / eps`` (bf16: ``eps = 2**-7``, so ``|w| > 512 · lr``): a lower bound.

    Examples:
        >>> lost_update_fraction([torch.tensor([1e-5, 0.02])], 1e-6, torch.bfloat16)
        0.5
    """
    limit = 4 * lr / torch.finfo(dtype).eps
    lost = total = 0
    for p in params:
        lost += int((p.detach().abs() > limit).sum())
        total += p.numel()
    return lost / max(total, 1)


def warn_lost_updates(precision: Any, params: Iterable[torch.Tensor], lr: float) -> None:
    """Warn when ``"bf16-true"``/``"16-true"`` would round away most AdamW steps of ``lr``."""
    dtype = precision_dtype(precision)
    if dtype is None or not str(precision).endswith("-true"):
        return
    share = lost_update_fraction(params, lr, dtype)
    if share > 0.5:
        warnings.warn(
            f"precision={str(precision)!r} stores the trained weights in {str(dtype).replace('torch.', '')}: an "
            f"optimizer step of lr={lr:g} is below the rounding of {share:.0%} of them and is lost. Use "
            "precision='bf16-mixed' (fp32 master weights, bf16 compute), or a larger learning rate", stacklevel=2)
