"""Fused loss kernels: log-probs and entropy from hidden states without ``[tokens, vocab]`` logits.

``fused_logprobs`` is the public entry point (a ``torch.library`` custom op underneath).
``implementations(device)`` names the implementations a device can run (``chunked`` and
``full_vocab`` in PyTorch everywhere; ``triton`` and ``triton_owned`` on CUDA); ``choose`` picks
one per call (forced by name, or timed once per shape bucket: ``chosen_implementation``,
``choices``, ``clear_choices``). ``chunked`` also holds the naive reference.
``head_loss_in_forward`` is the loss's other entry point: the head's gradient formed in the
forward pass, for objectives whose loss adds up over row chunks (`head_in_forward`). The Triton modules
are imported only on first use, since ``triton`` reads ``TRITON_INTERPRET`` when it is imported.
"""
from .choose import ENV as IMPL_ENV
from .choose import Choice, choices, chosen_implementation, clear_choices
from .chunked import reference_logprobs
from .fused_logprobs import fused_logprobs
from .head_in_forward import head_loss_in_forward, rows_per_chunk
from .implementations import implementations

__all__ = ["Choice", "IMPL_ENV", "choices", "chosen_implementation", "clear_choices", "fused_logprobs",
           "head_loss_in_forward", "implementations", "reference_logprobs", "rows_per_chunk"]
