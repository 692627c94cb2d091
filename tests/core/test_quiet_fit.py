"""A first fit prints only what is about the run (issue 26, item 9): Lightning's ModelCheckpoint
advice for manual optimization, its empty-validation-list warning, torch's LeafSpec deprecation
raised by Lightning, and the litlogger / litmodels tips are gone from a real fit on a plain
Trainer, while Lightning's warnings about the run itself still show."""
import logging
import warnings

import lightning as L
import lightning_utilities.core.rank_zero as rank_zero
from lightning.pytorch.callbacks import ModelCheckpoint

import tiny_task as task
from lightning_rlpt import PromptDataModule, RLModule

GONE = ("Using ModelCheckpoint with manual optimization", "Total length of `list` across ranks is zero",
        "isinstance(treespec, LeafSpec)", "litlogger", "litmodels")


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_plain_fit_prints_only_messages_about_the_run(tmp_path, warm_start_dir, arithmetic_rows):
    records = Records()
    rank_zero.log.addHandler(records)  # the logger Lightning's tips go through
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # above pytest's own filters: every warning is seen here
            module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0,
                              generation=dict(max_new_tokens=4, max_prompt_length=8))
            # Lightning's defaults (logger, progress bar, checkpointing, log_every_n_steps=50), no validation set
            trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, default_root_dir=str(tmp_path),
                                callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=1)])
            trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows[:16], batch_size=4))
    finally:
        rank_zero.log.removeHandler(records)
    printed = [str(w.message) for w in caught] + records.messages
    assert trainer.global_step == 2 and list((tmp_path / "ckpt").glob("*.ckpt"))
    for message in GONE:
        assert not [p for p in printed if message in p], message
    # Lightning's warning about this run (4 rollouts per epoch, a log every 50 steps) still shows,
    # and so does its hardware line.
    assert any("smaller than the logging interval Trainer(log_every_n_steps=50)" in p for p in printed)
    assert any(p.startswith("GPU available") for p in printed)


def test_the_filters_match_their_message_only():
    """The empty-list filter leaves the variant about a rank without data, which is about the run."""
    from lightning_rlpt.quiet import quiet_empty_validation, quiet_fit

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_fit()
        quiet_empty_validation()
        for message in ("Total length of `list` across ranks is zero, but local rank has zero length.",
                        "Using ModelCheckpoint with automatic optimization"):
            warnings.warn_explicit(message, UserWarning, "data.py", 1, module="lightning.pytorch.utilities.data")
        warnings.warn_explicit("Total length of `list` across ranks is zero. Please make sure this was your "
                               "intention.", UserWarning, "x.py", 1, module="my_project.data")  # not Lightning's
    assert len(caught) == 3


def test_the_engine_reload_filters_drop_two_idle_messages_and_keep_the_sign_of_a_broken_sync():
    """vLLM's "RotaryEmbedding: Failed to load weights" (tables it computes itself) and bitsandbytes'
    absent hub kernel go; the same vLLM words for a layer with weights (the tied-head bug's
    "ParallelLMHead: Failed to load weights") stay. The README quickstart's test checks a real run."""
    import logging

    from lightning_rlpt.quiet import quiet_engine_reload

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    quiet_engine_reload()
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    bnb_log = logging.getLogger("bitsandbytes.backends.cpu.ops")
    handler = Keep()
    # The filters alone, whatever ran before in this process: `import trl` sets VLLM_LOGGING_LEVEL=ERROR
    # (trl/_compat.py), and a vLLM engine started after it logs nothing below ERROR.
    levels = [log.level for log in (reload_log, bnb_log)]
    for log in (reload_log, bnb_log):
        log.addHandler(handler)
        log.setLevel(logging.WARNING)
    try:
        reload_log.warning("%s: Failed to load weights", "RotaryEmbedding")
        reload_log.warning("%s: Failed to load weights", "Llama3RotaryEmbedding")
        reload_log.warning("%s: Failed to load weights", "ParallelLMHead")
        bnb_log.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please ...", "no kernels")
        bnb_log.warning("some other bitsandbytes warning")
    finally:
        for log, level in zip((reload_log, bnb_log), levels):
            log.removeHandler(handler)
            log.setLevel(level)
    assert seen == ["ParallelLMHead: Failed to load weights", "some other bitsandbytes warning"]
