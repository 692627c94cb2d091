"""The log-prob implementations the op can run, by name, and which of them a device can use.

=================  ==========================================================================
``chunked``        `chunked`: vocabulary tiles x token chunks in PyTorch (any device; the CPU
                   default and the reference)
``full_vocab``     `full_vocab`: token chunks x the whole vocabulary on plain matmuls (cuBLAS on
                   CUDA; Liger-Kernel's fused linear cross-entropy design)
``triton``         `triton_logprobs`: Triton forward; backward adds into ``dh``/``dW`` atomically
``triton_owned``   the same forward; `triton_owned` backward: every program owns the gradient
                   rows it writes (no atomics, bitwise reproducible)
=================  ==========================================================================

The Triton ones need CUDA (or Triton's CPU interpreter: ``TRITON_INTERPRET=1``) and no float64.
``triton`` is imported on first use only: it reads ``TRITON_INTERPRET`` when it is imported.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Callable

import torch

from .chunked import chunked_backward, chunked_forward
from .full_vocab import full_vocab_backward, full_vocab_forward

PORTABLE = ("chunked", "full_vocab")
TRITON = ("triton", "triton_owned")
# Backwards that add into shared gradient rows atomically: their sums' order, hence last bits, vary
# run to run, so they are not candidates under torch.use_deterministic_algorithms(True).
ATOMIC_BACKWARD = frozenset({"triton"})


def _triton_forward(*args, **kwargs):
    from .triton_logprobs import triton_forward
    return triton_forward(*args, **kwargs)


def _triton_backward(*args, **kwargs):
    from .triton_logprobs import triton_backward
    return triton_backward(*args, **kwargs)


def _triton_owned_backward(*args, **kwargs):
    from .triton_owned import triton_owned_backward
    return triton_owned_backward(*args, **kwargs)


FORWARD: dict[str, Callable] = {"chunked": chunked_forward, "full_vocab": full_vocab_forward,
                                "triton": _triton_forward, "triton_owned": _triton_forward}
BACKWARD: dict[str, Callable] = {"chunked": chunked_backward, "full_vocab": full_vocab_backward,
                                 "triton": _triton_backward, "triton_owned": _triton_owned_backward}


def _triton_runs_on(device: torch.device) -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def implementations(device: torch.device | str, dtype: torch.dtype | None = None) -> tuple[str, ...]:
    """Names of the implementations usable on ``device`` (for inputs of ``dtype``, if given).

    Args:
        device: where the tensors live (``"cpu"``, ``"cuda"``, ``torch.device("cuda:1")``).
        dtype: the inputs' dtype; float64 excludes the Triton kernels (no fast fp64 ``tl.dot``).

    Examples:
        >>> implementations("cpu")[:2]
        ('chunked', 'full_vocab')
    """
    device = torch.device(device)
    if dtype != torch.float64 and _triton_runs_on(device):
        return PORTABLE + TRITON
    return PORTABLE


def forward_candidates(names: tuple[str, ...]) -> tuple[str, ...]:
    """The names whose forward functions differ (``triton_owned`` shares ``triton``'s): each timed once."""
    seen, out = set(), []
    for name in names:
        if FORWARD[name] not in seen:
            seen.add(FORWARD[name])
            out.append(name)
    return tuple(out)


def deterministic_backwards(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` without the backwards that add atomically (`ATOMIC_BACKWARD`)."""
    return tuple(name for name in names if name not in ATOMIC_BACKWARD)
