"""Small helpers the seed-method callbacks share (not part of the public API)."""
from __future__ import annotations

import hashlib
from typing import Any

import torch


def log_metrics(module: Any, prefix: str, values: dict[str, float]) -> None:
    """``module.log`` each value as ``prefix/name`` for this step (values are already global)."""
    for name, value in values.items():
        module.log(f"{prefix}/{name}", float(value), on_step=True, on_epoch=False, batch_size=1)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def require_reference(module: Any, who: str) -> None:
    """KL callbacks drive the KL-to-reference term, which exists only with a reference."""
    if not getattr(module, "use_reference", False):
        raise ValueError(f"{who} drives the KL-to-reference term, but this RLModule has no reference model "
                         "(use_reference is False): pass reference=True (or kl_coef > 0) to RLModule")


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean over real tokens: ``[N, C] -> [N]``."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def seeded_generator(*keys: int) -> torch.Generator:
    """A generator determined by ``keys`` alone (e.g. seed, step, rank): streams that differ per
    rank and per step, yet need no saved state to resume exactly — only the keys."""
    digest = hashlib.sha256(repr(tuple(int(k) for k in keys)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
