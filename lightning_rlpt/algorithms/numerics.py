"""Numerical guards shared by the algorithms."""
from __future__ import annotations

import torch

# exp(±20) ≈ 4.9e8 / 2.1e-9: far beyond any ratio that still carries information, yet finite in
# fp16/bf16 sums. Every log-ratio that is exponentiated is clamped to ±MAX_LOG_RATIO first.
MAX_LOG_RATIO = 20.0


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def safe_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp`` of a log-ratio clamped to ``±MAX_LOG_RATIO``."""
    return clamp_log_ratio(log_ratio).exp()
