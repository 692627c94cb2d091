"""`HeadInForward`: the update's loss with the LM head's gradient formed in the forward pass.

The decoder runs once on the micro-batch; the head and the objective then run on chunks of
whole rows (`kernels.head_in_forward`), each chunk's share of the loss computed by
`PolicyUpdate.objective_terms` with the mini-batch's global counts, exactly as a micro-batch's
is. So every objective takes this path without writing its gradient: autograd differentiates
its share with respect to the chunk's log-probs and entropies, two ``[rows, C]`` tensors, and
the kernel turns that into the head's gradients while the chunk's logits are still in memory.
Three GEMMs of ``tokens × H × V`` instead of the four of the recompute path.

The recompute path (`kernels.fused_logprobs` under autograd) is taken, and said once per
reason, when this one cannot be: ``head_gradient="recompute"``, ``"auto"`` (the default) off
CPU (not yet measured on a GPU), no fused kernel for the head
(soft-capped logits, FSDP2, DoRA or LoRA dropout on the head), an overridden
``policy_logprobs`` (this path would not call it), a bf16 or fp16 head weight (its
float32 copy would cost ``4·V·H`` bytes), a high-entropy threshold
(``top_entropy_quantile`` < 1: the tokens that tie it must see the entropies that set it), or
one row's logits over the chunk budget (``kernels.head_in_forward.BUDGET_BYTES``).
See docs/kernels.md.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..batching import span_mask
from ..experience import Experience
from ..model.logprobs import completion_hidden, linear_head
from .step_metrics import add_metrics

log = logging.getLogger(__name__)
HEAD_GRADIENTS = ("auto", "forward", "recompute")


class HeadInForward:
    """Which path the update's head takes, and the forward-pass one (``module`` is the `RLModule`)."""

    _head: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by `eligible`, taken by `loss`

    def __init__(self, mode: str = "auto"):
        if mode not in HEAD_GRADIENTS:
            raise ValueError(f"head_gradient={mode!r}: choose 'forward' (the head's gradient formed in the forward "
                             "pass where the objective and head allow, docs/kernels.md), 'recompute', or 'auto' "
                             "(forward on CPU, recompute on GPU, where the forward path is not yet measured)")
        self.mode, self.said = mode, set()

    def eligible(self, module: Any, mb: Experience) -> bool:
        """Whether this loss forward can take the forward-pass path (the reason said once if not)."""
        if self.mode == "recompute" or not torch.is_grad_enabled():
            return False
        if self.mode == "auto" and module.device.type != "cpu":
            return self._no(f"head_gradient='auto' on {module.device.type}: the forward-pass path is measured on CPU "
                            "only so far (the Triton kernels recompute on GPU); head_gradient='forward' forces it")
        if module.hparams.top_entropy_quantile < 1:
            return self._no("top_entropy_quantile < 1: the high-entropy threshold is a quantile of the fused "
                            "kernel's entropies, and a token whose entropy ties it must be compared with the same "
                            "kernel's value (this path's full-vocabulary entropy can differ in the last bit)")
        if _overrides_policy_logprobs(module):
            return self._no("policy_logprobs is overridden (a subclass or the instance): this path runs the decoder "
                            "and the head itself and would not call it")
        head = linear_head(module.policy, module.hparams.use_fused_kernel)
        if isinstance(head, str):
            return self._no(head)
        if head[0].dtype not in (torch.float32, torch.float64):
            return self._no(f"the head's weight is {head[0].dtype}: this path would hold a float32 copy of it "
                            "(the recompute path casts it tile by tile)")
        from lightning_rlpt.kernels import rows_per_chunk

        width, vocab = mb.completion_ids.shape[1], head[0].shape[0]
        if rows_per_chunk(width, vocab, itemsize=_itemsize(module, head[0])) < 1:
            return self._no(f"a completion over {_widest(vocab, _itemsize(module, head[0]))} tokens: one row's logits "
                            f"at vocabulary {vocab} are over the chunk budget (docs/kernels.md)")
        self._head = head  # `loss` uses it: a LoRA head's effective weight is built once
        return True

    def _no(self, reason: str) -> bool:
        if reason not in self.said:
            self.said.add(reason)
            log.info("the LM head's gradient is recomputed in the backward (four GEMMs, not three): %s", reason)
        return False

    def loss(self, module: Any, mb: Experience, mask: torch.Tensor, counts: tuple[float, ...],
             entropy_threshold: torch.Tensor | None, kept_tokens: float | None
             ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """`PolicyUpdate.loss_and_logprobs` by row chunks: ``(loss, metrics, detached log-probs)``."""
        from lightning_rlpt.kernels import head_loss_in_forward, rows_per_chunk

        (weight, bias), self._head = self._head, None
        width = mb.completion_ids.shape[1]
        counts = (*counts[:2], counts[2] if len(counts) > 2 else mask.sum().item())  # bnpo: this rank's tokens
        attention = span_mask(mb) if module.micro_batching.padding_free else mb.attention_mask
        hidden = completion_hidden(module.policy, mb.input_ids, attention, width, module.micro_batching.padding_free)
        rows = rows_per_chunk(width, weight.shape[0], itemsize=_itemsize(module, weight))

        def chunk_loss(span: slice, logp: torch.Tensor, entropy: torch.Tensor):
            part = mb.select(list(range(span.start, span.stop)))
            return module.objective_terms(part, logp, entropy, mask[span], counts, entropy_threshold, kept_tokens)

        with torch.autocast(hidden.device.type, enabled=False):  # the head in fp32 (fp64), as the fused kernel's
            loss, logp, _, parts = head_loss_in_forward(hidden, weight, bias, mb.completion_ids,
                                                        module.sampling.temperature, chunk_loss, rows)
        metrics: dict[str, float] = {}
        for part in parts:
            add_metrics(metrics, part)
        return loss, metrics, logp


def _itemsize(module: Any, weight: torch.Tensor) -> int:
    """Bytes per logit in the chunk's buffer: the kernel accumulates in float64 when either the
    hidden states (the policy's dtype) or the head is float64, else float32."""
    policy = next(module.policy.parameters()).dtype
    return 8 if torch.float64 in (weight.dtype, policy) else 4


def _widest(vocab: int, itemsize: int) -> int:
    """The longest completion whose one row fits the chunk budget."""
    from lightning_rlpt.kernels import head_in_forward

    return head_in_forward.BUDGET_BYTES // (vocab * itemsize)


def _overrides_policy_logprobs(module: Any) -> bool:
    """Whether ``module.policy_logprobs`` is another than `RLModule`'s own."""
    if "policy_logprobs" in vars(module):
        return True
    owner = next(c for c in type(module).__mro__ if "policy_logprobs" in vars(c))
    return owner.__module__ != "lightning_rlpt.module"
