"""What the module's rollout correction changes in the loss, observed through `RLModule.loss`:
the "correction engages" checks of the vLLM tests read this instead of recomputing the weights."""
import torch


def correction_in_loss(module, exp) -> float:
    """Largest change, over the rows of ``exp``, that the module's ``rollout_correction`` makes
    to the row's loss with advantage 1: for an on-policy row under a token-mean aggregation
    that is ``|mean_t w_t − 1|``. 0 when the weights are not applied (or are all 1).

    Args:
        module: an `RLModule` inside its fit (``rollout_correction`` set, kl_coef 0).
        exp: the mini-batch about to be trained on (``on_before_loss``), with behaviour log-probs.
    """
    mode, effects = module.hparams.rollout_correction, []
    try:
        with torch.no_grad():
            for i in range(len(exp)):  # one row at a time: rows' changes of opposite sign cannot cancel
                row = exp.select([i])
                row.advantages = torch.ones_like(row.advantages)
                module.hparams.rollout_correction = mode
                corrected = module.loss(row)[0].item()
                module.hparams.rollout_correction = None
                effects.append(abs(corrected - module.loss(row)[0].item()))
    finally:
        module.hparams.rollout_correction = mode
    return max(effects)
