"""Padding of token rows: prompts on the left, completions on the right (one helper each)."""
from __future__ import annotations

import torch


def left_pad(rows: list[list[int]], pad_id: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def right_pad(rows: list[list[int]], pad_value: float | int, dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    width = width if width is not None else max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), pad_value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def pad_width(t: torch.Tensor, width: int, value: float | int, left: bool) -> torch.Tensor:
    """``[N, w]`` → ``[N, width]``, filling with ``value`` on the left or the right."""
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    fill = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([fill, t] if left else [t, fill], dim=1)
