"""Lightning's messages that are wrong or idle for an RL run, silenced one message at a time.

A new user's first fit printed a screen of text that said nothing about their run (issue 26,
item 9). Each filter here matches exactly one message (its start, its category and, for
warnings, the module that raises it), so every other warning, Lightning's included, still shows:

- `quiet_fit` (from ``RLModule.configure_callbacks``, at the start of every fit):
  ``ModelCheckpoint``'s 15-line advice to save a "pre-optimization state" under manual
  optimization. RLModule's checkpoint holds the state after the step on purpose: resuming from
  it continues the run exactly (docs/cli.md, "Resuming a run"), so the advice is wrong here. And torch's
  ``FutureWarning`` about ``LeafSpec``, raised by Lightning's own ``utilities/_pytree.py`` on every
  fit with this project's torch: nothing a user can act on.
- `quiet_empty_validation` (from ``PromptDataModule.val_dataloader`` when it has no validation
  set): "Total length of `list` across ranks is zero", about the empty list that is Lightning's
  way of saying "no validation".
- `hide_lightning_tips` (from ``RLModule.__init__``, before the Trainer is built, which prints the
  first): the advertisements for ``litlogger`` and ``litmodels``.
- `quiet_engine_reload` (when the colocated vLLM engine starts): at every weight sync vLLM logs
  "RotaryEmbedding: Failed to load weights" for the rotary tables it computes itself (nothing is
  wrong, and the same words for a layer that does hold weights, "ParallelLMHead: ...", are the
  sign of a broken sync: those stay); and bitsandbytes, imported by vLLM's reload, logs that its
  optional hub kernel for 4-bit matmuls is absent, in a run with no 4-bit weights (a run that
  quantizes imported bitsandbytes earlier, so its message has already shown).
"""
from __future__ import annotations

import logging
import warnings

# (message start, category, module that raises it): each a regular expression, as `warnings.filterwarnings` reads.
FIT_WARNINGS = (
    ("Using ModelCheckpoint with manual optimization and every_n_train_steps, but no pre-optimization state",
     UserWarning, r"lightning\.pytorch\.callbacks\.model_checkpoint"),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
)
# The ", but local rank has zero length" variant (a rank without data) stays: that one is about the run.
EMPTY_VALIDATION = (r"Total length of `list` across ranks is zero\. Please make sure this was your intention",
                    UserWarning, r"lightning\.pytorch\.utilities\.data")
TIPS = ("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]",
        "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels]")


def quiet_fit() -> None:
    """Silence `FIT_WARNINGS` (idempotent: `warnings.filterwarnings` replaces an equal filter)."""
    for message, category, module in FIT_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def quiet_empty_validation() -> None:
    """Silence Lightning's warning about the empty validation loader of a run without validation."""
    message, category, module = EMPTY_VALIDATION
    warnings.filterwarnings("ignore", message=message, category=category, module=module)


class _Drop(logging.Filter):
    """Drops the log records ``matches`` says yes to."""

    def __init__(self, matches):
        super().__init__()
        self.matches = matches

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.matches(record)


_TIP_FILTER = _Drop(lambda r: isinstance(r.msg, str) and r.msg.startswith(TIPS))
_ROTARY_RELOAD = _Drop(lambda r: r.msg == "%s: Failed to load weights" and str(r.args[0]).endswith("RotaryEmbedding"))
_BNB_HUB_KERNEL = _Drop(lambda r: isinstance(r.msg, str) and r.msg.startswith("Failed to load CPU gemm_4bit_forward"))


def hide_lightning_tips() -> None:
    """Drop Lightning's ``litlogger`` / ``litmodels`` tips from its rank-zero logger (idempotent:
    `logging.Logger.addFilter` adds a filter once)."""
    import lightning.pytorch  # noqa: F401  (on import it points the rank-zero logger below at its own)
    import lightning_utilities.core.rank_zero as rank_zero

    rank_zero.log.addFilter(_TIP_FILTER)


def quiet_engine_reload() -> None:
    """Drop vLLM's rotary-table reload warning and bitsandbytes' absent-hub-kernel message (module
    docstring). Filters on the loggers by name: they exist before their modules are imported."""
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_ROTARY_RELOAD)
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_BNB_HUB_KERNEL)
