"""The policy-loss family: its registry, signature and traits (verl's ``core_algos`` style).

Signature of every loss::

    fn(logprobs, old_logprobs, advantages, mask, **options) -> (loss [N, C], stats)

``logprobs`` are the current policy's (with grad), ``old_logprobs`` the rollout-time policy's
(detached), ``advantages`` ``[N]`` or ``[N, C]``, ``mask`` ``[N, C]``. ``stats`` maps a metric
name to a ``[N, C]`` float tensor that the module averages over the mask and logs (for example
the clip indicators behind ``clip_ratio/low_mean``). Extra inputs a loss may need (behaviour
log-probs, policy versions, ...) arrive as keyword options. The module passes every loss the
`MODULE_OPTIONS` (a loss ignores those it does not use through ``**_``); a loss's other keyword
parameters with defaults are its own options, set through ``policy_loss_kwargs``, which refuses
any other key at construction (`presets.check_objective`).

Traits, declared at registration:

- ``self_correcting``: weights each token by π_prox/π_behav itself, so it needs the engine's
  behaviour log-probs and the module's own ``rollout_correction`` must stay off;
- ``on_policy_only``: no importance ratio, so a rollout must not be reused;
- ``token_clip``: reads ``clip_low``/``clip_high`` as a token ratio range (what `BAPO` moves);
- ``aggregation``: the one ``loss_aggregation`` the loss is made for (None: any), e.g. ``luspo``,
  whose length factor assumes ``seq-mean-token-mean``.
"""
from __future__ import annotations

import torch

from ...registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss",
                                   traits={"self_correcting": False, "on_policy_only": False, "token_clip": False,
                                           "aggregation": None})

Stats = dict[str, torch.Tensor]

# What `stages.update` and `surrogate` pass to every loss; never a user's to set (a duplicate
# keyword would fail at the first step, so ``policy_loss_kwargs`` refuses them up front).
MODULE_OPTIONS = ("clip_low", "clip_high", "dual_clip", "staleness", "behaviour_logprobs")


def per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[N]`` sequence advantages broadcast to ``like``'s ``[N, C]`` (token-level ones pass through)."""
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages
