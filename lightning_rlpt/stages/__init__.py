"""RLModule's parts, one file per stage of the walk a batch takes (docs/architecture.md):
`experience` (rollout → rewards → log-probs → advantages) and `update` (mini-batches of
gradient-accumulated micro-batches → optimizer steps), each a mixin of `RLModule`."""
