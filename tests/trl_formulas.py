"""TRL's helpers that several tests compare against, transcribed (TRL is not installed in the
test environment): each cites the TRL file and function it follows."""
import torch


def nanstd(tensor: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
    """trl/trainer/utils.py ``nanstd``: the std of the non-NaN values with Bessel's correction
    (NaN when fewer than two), its ``count / (count - 1)`` factor computed as TRL computes it."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    std = torch.sqrt(variance)
    return std if keepdim else (std.squeeze(dim) if dim is not None else std.squeeze())
