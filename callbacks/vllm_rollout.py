"""`VLLMRollout`: sample training (and validation) rollouts with vLLM instead of ``generate``."""
from __future__ import annotations

import warnings
from typing import Any

import lightning as L

from lightning_rlpt.model.precision import precision_dtype, check_cpu_precision
from lightning_rlpt.model.weights import check_not_repacked, policy_weights
from lightning_rlpt.rollout.context import context_length, model_config
from lightning_rlpt.rollout.vllm.checks import import_vllm
from lightning_rlpt.rollout.vllm.engine import VLLMEngine

from .engine_callback import EngineCallback


class VLLMRollout(EngineCallback):
    """Replace the module's rollout engine with a colocated vLLM engine for the run.

    At ``setup`` (fit, or validate when ``validate=True``) the inputs are checked and a
    `VLLMEngine` starts from the policy's config and receives its weights in memory. After
    every ``sync_every``-th optimizer step the module's call to ``engine.sync_weights`` copies
    the (LoRA-merged / QLoRA-dequantised) weights over; ``engine.policy_version`` records the
    step they come from and lands in ``Experience.policy_version``. vLLM reports the sampled
    tokens' log-probs, so the module measures the train/inference mismatch
    (``sampling/importance_sampling_ratio/*``, ``sampling/logp_diff/*``) and applies its
    ``rollout_correction``. Validation during ``fit`` uses the same engine, after a sync when
    the engine is behind the policy, so it always scores the policy being trained. At
    ``teardown`` (or on an exception) the engine is shut down and its memory freed.

    Args:
        gpu_memory_utilization: share of GPU memory for vLLM (weights + KV cache); colocated
            with training, so well below 1. On CPU vLLM reads it as a share of RAM; the KV
            cache is sized by ``kv_cache_memory_bytes`` there instead.
        tensor_parallel_size: GPUs vLLM shards the model over (1 on CPU).
        max_model_len: longest prompt + completion (default: the module's
            ``max_prompt_length`` + the largest ``max_new_tokens``; with tools, an environment or
            a ``rollout_func`` the model's ``max_position_embeddings``, docs/agents.md).
        dtype: vLLM's dtype (default: bfloat16 under the Trainer's ``"bf16-true"``/``"bf16-mixed"``,
            float16 under ``"16-*"``, else the policy's; fp32 gives parity with an fp32 learner).
        enable_prefix_caching: reuse the prompt's KV cache across the G samples of a group
            (None: vLLM's default).
        seed: vLLM's engine seed (each request also gets its own seed from the module's stream).
        temperature / top_p / top_k / max_tokens / stop: training-rollout overrides of the
            module's `SamplingConfig` (None keeps the module's). ``stop`` takes strings or token
            ids. The learner scores at the module's temperature, so an override of it makes the
            rollout off-policy by design and the IS correction accounts for it.
        sync_every: optimizer steps between weight syncs; 1 is on-policy, k > 1 lets the
            engine lag up to k-1 steps (the IS ratio then measures that lag).
        sleep_between_phases: ``LLM.sleep(level=1)`` after each rollout, wake for the next
            (frees the KV cache for training). CUDA only: a documented no-op on CPU.
        validate: also start an engine for ``trainer.validate`` runs (default: those use the
            HF engine and start nothing).
        kv_cache_memory_bytes: explicit KV-cache size (default on CPU: sized for 256
            full-length sequences, 64 MiB - 4 GiB).
        engine: an already started `VLLMEngine` to use instead of starting one (kept open at
            teardown; e.g. one engine for several fits of the same architecture).
        **llm_kwargs: more ``vllm.LLM`` arguments.

    Examples:
        >>> trainer = L.Trainer(max_steps=100, callbacks=[VLLMRollout(gpu_memory_utilization=0.3)])  # doctest: +SKIP
        >>> trainer.fit(module, datamodule=data)  # doctest: +SKIP
    """

    requires = EngineCallback.requires + ("policy", "val_sampling")

    def __init__(self, *, gpu_memory_utilization: float = 0.3, tensor_parallel_size: int = 1,
                 max_model_len: int | None = None, dtype: Any = None, enable_prefix_caching: bool | None = None,
                 seed: int = 0, temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None, max_tokens: int | None = None, stop: list[Any] | None = None,
                 sync_every: int = 1, sleep_between_phases: bool = False, validate: bool = False,
                 kv_cache_memory_bytes: int | None = None, engine: VLLMEngine | None = None, **llm_kwargs: Any):
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1 optimizer steps (got {sync_every}); 1 is on-policy")
        if temperature is not None and temperature <= 0:
            raise ValueError(f"the training temperature override must be > 0 (got {temperature})")
        self.overrides = {k: v for k, v in dict(temperature=temperature, top_p=top_p, top_k=top_k,
                                                 max_tokens=max_tokens, stop=stop).items() if v is not None}
        self.options = dict(gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                            max_model_len=max_model_len, dtype=dtype, enable_prefix_caching=enable_prefix_caching,
                            seed=seed, kv_cache_memory_bytes=kv_cache_memory_bytes, **llm_kwargs)
        self.sync_every, self.sleep_between_phases, self.validate = sync_every, sleep_between_phases, validate
        super().__init__()  # max_staleness stays 0: a colocated engine does not declare can_run_ahead
        self._given = engine

    # ---------------------------------------------------------------- start-up
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" and not (stage == "validate" and self.validate):
            return
        import_vllm()  # fail first, with the install command, if vLLM is missing
        check_cpu_precision(trainer)
        self.check_fit(trainer, pl_module)
        self._check(pl_module)
        # The precision plugin converts the policy only after setup: take the dtype from the trainer.
        options = {**self.options, "dtype": self.options["dtype"] or precision_dtype(trainer.precision)}
        self.install(trainer, pl_module, self._given or VLLMEngine.from_module(
            pl_module, overrides=self.overrides, sync_every=self.sync_every,
            sleep_between_phases=self.sleep_between_phases, **options))
        if self._given is not None:
            self._adopt(self._given, pl_module)

    def _check(self, module: L.LightningModule) -> None:
        self._refuse_turn_budget_override(module)
        for param in module.policy.parameters():
            check_not_repacked(param)
        changes = module.sampling.distribution_changes()
        if changes:
            warnings.warn(f"with {', '.join(changes)} vLLM's behaviour log-probs are those of the distribution "
                          "really sampled from (truncated, penalised, renormalised) while the learner's are the "
                          "policy's at the temperature; the importance ratio then also carries that difference "
                          "(see docs/vllm.md, docs/long_reasoning.md)", stacklevel=3)

    def _adopt(self, engine: VLLMEngine, module: L.LightningModule) -> None:
        """A caller's engine: check it fits this module, apply this callback's settings, sync."""
        needed = context_length(module, None, self.overrides.get("max_tokens"), model_config(module.policy),
                                minimum=True)
        if engine.max_model_len < needed:
            raise ValueError(f"the given engine's max_model_len={engine.max_model_len} is shorter than max_prompt_length "
                             f"+ max_new_tokens = {needed}; start it with max_model_len >= {needed}")
        engine.sync_every, engine.overrides = self.sync_every, dict(self.overrides)
        engine.phase, engine.where = "training", "start-up"
        self._sync_now(module)

    def _sync_now(self, module: L.LightningModule) -> None:
        self.engine.load_weights(policy_weights(module.policy), module.policy_version)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A checkpoint (ckpt_path=...) is restored after setup: send the weights as they are now.
        if self.engine is not None:
            self._sync_now(pl_module)

    # ---------------------------------------------------------------- shutdown (EngineCallback releases;
    # it also sets the engine's phase and step, and syncs a lagging engine before validation)
    def close_engine(self, engine: VLLMEngine) -> None:
        if engine is not self._given:  # a caller's engine stays open for the caller
            engine.close()
