"""Fused loss kernels: log-probs and entropy from hidden states without ``[tokens, vocab]`` logits.

``fused_logprobs`` is the public entry point (a ``torch.library`` custom op underneath: the
chunked PyTorch path on CPU, Triton kernels on CUDA). ``chunked`` holds the PyTorch path and
the naive reference; ``triton_logprobs`` the kernels (imported only on first CUDA use, since
``triton`` reads ``TRITON_INTERPRET`` when it is imported).
"""
from .chunked import reference_logprobs
from .fused_logprobs import fused_logprobs

__all__ = ["fused_logprobs", "reference_logprobs"]
