"""`VLLMEngine`: a colocated vLLM engine behind the `RolloutEngine` interface.

The engine lives in the training process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights
are handed over in memory: after an optimizer step the module calls ``sync_weights``, the
policy's full (LoRA-merged, QLoRA-dequantised, see `model.weights`) tensors stream into vLLM's
``reload_weights`` under checkpoint names, and the prefix cache is reset.

Behaviour log-probs: each completion token comes with vLLM's log-prob of the *sampled*
token (``logprobs=0``) in ``logprobs_mode="processed_logprobs"``: the log-softmax of
``logits / temperature`` (greedy requests: of the raw logits). The learner computes exactly
``log_softmax(logits / temperature)`` (`model.logprobs.completion_logprobs`), so with top_k = 0 and
top_p = 1 (the defaults) both describe the same distribution and their ratio measures only the
train/inference mismatch and weight staleness. ``raw_logprobs`` (vLLM's default) would be
taken before the temperature and differ whenever T ≠ 1. With top-k/top-p truncation,
"processed" also includes the renormalisation over the kept tokens: it is then the true
density the token was drawn from (what importance sampling needs), while the learner's value
is the untruncated one, so the IS ratio also carries the truncation. The same holds for
``min_p`` (applied after the temperature, before top-k/top-p) and ``repetition_penalty``
(CTRL's, on prompt and completion tokens, before the temperature; greedy requests too), which
"processed" includes as well (docs/long_reasoning.md).

Sampling is reproducible: request ``i`` of a call seeded ``seed`` draws with its own seed
(`per_row.request_seeds`, which the HF engine uses too), so the module's checkpointed seed
stream fixes every completion. ``SamplingConfig.max_batch_rows`` is the HF engine's: vLLM
schedules its own batches.

Examples:
    >>> engine = VLLMEngine.from_module(module, max_model_len=64)  # doctest: +SKIP
    >>> out = engine.generate([[1, 4, 5]], module.sampling, seed=0)  # doctest: +SKIP
    >>> engine.close()  # doctest: +SKIP
"""
from __future__ import annotations

import copy
import gc
import os
import random
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from ...model.weights import policy_weights
from ...quiet import quiet_engine_reload
from ..context import context_length, model_config
from ..engine import RolloutEngine, RolloutOutput, WeightSource
from ..sampling.generation_kwargs import check_vllm_kwargs
from ..sampling.per_row import request_seeds
from ..sampling import SamplingConfig
from .checks import (check_head_dim, check_native_architecture, check_tensor_parallel, head_dim, import_vllm,
                     serves_lm_head, without_unserved_head)

LOGPROBS_MODE = "processed_logprobs"
OVERRIDES = ("temperature", "top_p", "top_k", "max_tokens", "stop")


def policy_dtype(policy: nn.Module) -> torch.dtype:
    """The dtype the policy computes in (QLoRA: the floating parameters beside the 4-bit base)."""
    return next((p.dtype for p in policy.parameters() if p.is_floating_point()), torch.float32)


def vllm_dtype(given: Any, policy: nn.Module) -> torch.dtype:
    """vLLM's dtype: the one given (a ``torch.dtype`` or its name), else the policy's."""
    dtype = given or policy_dtype(policy)
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def export_model_dir(config: Any, tokenizer: Any, dtype: torch.dtype, path: str) -> str:
    """config.json + tokenizer files for vLLM; the weights arrive by `VLLMEngine.load_weights`.
    ``quantization_config`` is dropped: vLLM receives dense (dequantised) weights."""
    config = copy.deepcopy(config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = dtype
    config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def kv_cache_bytes(config: Any, dtype: torch.dtype, max_model_len: int, sequences: int = 256) -> int:
    """A CPU KV-cache budget for ``sequences`` full-length sequences, within [64 MiB, 4 GiB]
    (vLLM's CPU default reserves a fraction of all RAM, too much beside training)."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim(config) * torch.finfo(dtype).bits // 8
    return int(min(max(per_token * max_model_len * sequences, 64 << 20), 4 << 30))


@contextmanager
def preserved_global_rng() -> Iterator[None]:
    """vLLM seeds Python/NumPy/torch globally when it starts; keep the trainer's streams."""
    import numpy as np

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None, torch.get_num_threads())
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])
        torch.set_num_threads(states[4])


class VLLMEngine(RolloutEngine):
    """Sample completions with vLLM; receive the policy's weights every ``sync_every`` steps.

    Args:
        model: a directory with config.json and tokenizer files (weights too unless
            ``load_format="dummy"``, then `load_weights` must run before `generate`).
        eos_token_id: ends a completion (kept as its last token, as the HF engine does).
        max_model_len: the longest prompt + completion in tokens.
        dtype: vLLM's compute dtype (float32 for exact parity with an fp32 learner).
        gpu_memory_utilization / tensor_parallel_size / enable_prefix_caching / seed: as vLLM's.
        kv_cache_memory_bytes: KV-cache size (on CPU the default comes from `kv_cache_bytes`).
        sync_every: optimizer steps between weight syncs (1 = on-policy).
        sleep_between_phases: free the KV cache and offload weights (``LLM.sleep(level=1)``)
            after each rollout, wake before the next one. Needs CUDA; a no-op on CPU.
        overrides: training-rollout settings replacing the module's (``temperature``,
            ``top_p``, ``top_k``, ``max_tokens``, ``stop``: strings or token ids).
        **llm_kwargs: passed to ``vllm.LLM``.

    ``policy_version`` is the optimizer step whose weights vLLM holds; ``where`` (set by
    `VLLMRollout`) names the trainer step in error messages.

    Examples:
        >>> engine = VLLMEngine("ckpt_dir", eos_token_id=2, max_model_len=64)  # doctest: +SKIP
        >>> engine.generate([[1, 4, 5, 13]], SamplingConfig(max_new_tokens=4), seed=0).completion_ids  # doctest: +SKIP
        [[7, 9, 2]]
    """

    return_logprobs = True  # every completion comes with the sampled tokens' log-probs
    # can_run_ahead stays False: the engine shares the trainer's process and device, and its
    # `generate` from a worker thread beside training is untested.

    def __init__(self, model: str, *, eos_token_id: int, max_model_len: int, dtype: Any = "float32",
                 gpu_memory_utilization: float = 0.3, tensor_parallel_size: int = 1,
                 enable_prefix_caching: bool | None = None, seed: int = 0, kv_cache_memory_bytes: int | None = None,
                 sync_every: int = 1, sleep_between_phases: bool = False, overrides: dict[str, Any] | None = None,
                 **llm_kwargs: Any):
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1 optimizer steps (got {sync_every}); 1 is on-policy")
        unknown = set(overrides or {}) - set(OVERRIDES)
        if unknown:
            raise ValueError(f"unknown sampling override(s) {sorted(unknown)}; known: {list(OVERRIDES)}")
        vllm = import_vllm()
        from vllm.platforms import current_platform

        quiet_engine_reload()

        self.eos_token_id, self.max_model_len, self.sync_every = eos_token_id, max_model_len, sync_every
        self.overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        self.can_sleep = bool(sleep_between_phases) and current_platform.is_sleep_mode_available()
        self.asleep, self.phase, self.where, self.syncs = False, "training", "start-up", 0
        self.policy_version, self._tmpdir = 0, None
        self.dtype = str(dtype).replace("torch.", "")  # vLLM's compute dtype; synced weights are cast to it
        kwargs = dict(model=model, dtype=self.dtype, max_model_len=max_model_len,
                      gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                      seed=seed, logprobs_mode=LOGPROBS_MODE, enforce_eager=not torch.cuda.is_available(),
                      generation_config="vllm", enable_sleep_mode=self.can_sleep, **llm_kwargs)
        if enable_prefix_caching is not None:
            kwargs["enable_prefix_caching"] = enable_prefix_caching
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        # Under DDP/FSDP the trainer's process group exists before vLLM starts; vLLM's shutdown
        # would destroy it (see `close`).
        self._trainer_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        with preserved_global_rng():
            self.llm = vllm.LLM(**kwargs)
        self.served_head = serves_lm_head(inspection(self.llm))

    @classmethod
    def from_module(cls, module: Any, *, max_model_len: int | None = None, dtype: Any = None,
                    tensor_parallel_size: int = 1, overrides: dict[str, Any] | None = None,
                    kv_cache_memory_bytes: int | None = None, **kwargs: Any) -> "VLLMEngine":
        """An engine for an `RLModule`'s policy, checked first, started, then synced.

        vLLM starts from the policy's config alone (``load_format="dummy"``) and receives the
        current weights in memory, so full, LoRA and QLoRA policies, models given as
        ``nn.Module`` and restored checkpoints all take the same path.
        """
        import_vllm()
        config = model_config(module.policy)
        on_gpu = torch.cuda.is_available()
        check_head_dim(config, on_gpu)
        check_native_architecture(config, "VLLMRollout")
        check_tensor_parallel(tensor_parallel_size, on_gpu)
        length = context_length(module, max_model_len, (overrides or {}).get("max_tokens"), config)
        dtype = vllm_dtype(dtype, module.policy)
        if kv_cache_memory_bytes is None and not on_gpu:
            kv_cache_memory_bytes = kv_cache_bytes(config, dtype, length)
        tmp = export_model_dir(config, module.tokenizer, dtype, tempfile.mkdtemp(prefix="rlpt-vllm-"))
        try:
            engine = cls(tmp, eos_token_id=module.tokenizer.eos_token_id, max_model_len=length, dtype=dtype,
                         tensor_parallel_size=tensor_parallel_size, overrides=overrides,
                         kv_cache_memory_bytes=kv_cache_memory_bytes, load_format="dummy", **kwargs)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        engine._tmpdir = tmp
        engine.load_weights(policy_weights(module.policy), module.policy_version)
        return engine

    # ---------------------------------------------------------------- generation
    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        """Completion ids (ending with EOS when stopped by it) and the sampled tokens' log-probs;
        ``seed``: one for the call or one per row (see `per_row.request_seeds`)."""
        from vllm.inputs import TokensPrompt

        sampling, stop = self.effective_sampling(sampling)
        self._check_lengths(prompt_ids, sampling.max_new_tokens)
        params = self.sampling_params(sampling, stop, request_seeds(seed, len(prompt_ids)))
        self.wake_up()
        try:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        except Exception as err:
            raise RuntimeError(
                f"vLLM generation failed at {self.where} ({self.phase} rollout of {len(prompt_ids)} prompts): "
                f"{type(err).__name__}: {err}. Checkpoints saved so far are intact: fix the cause and resume with "
                "trainer.fit(..., ckpt_path=<last checkpoint>)") from err
        finally:
            self.sleep()
        return self.to_output(outs)

    def effective_sampling(self, sampling: SamplingConfig) -> tuple[SamplingConfig, list[Any]]:
        """The module's settings with the training overrides applied (never to validation)."""
        stop = list(self.overrides.get("stop") or [])
        if self.phase != "training":
            return sampling, stop
        names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_tokens": "max_new_tokens"}
        changes = {names[k]: v for k, v in self.overrides.items() if k in names}
        return (replace(sampling, **changes) if changes else sampling), stop

    def sampling_params(self, sampling: SamplingConfig, stop: list[Any], seeds: list[int]) -> list[Any]:
        from vllm import SamplingParams

        words = [s for s in stop if isinstance(s, str)]
        common = dict(max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=sampling.top_k, min_p=sampling.min_p, repetition_penalty=sampling.repetition_penalty,
                      logprobs=0, stop=words or None, detokenize=bool(words),
                      stop_token_ids=[self.eos_token_id] + [s for s in stop if isinstance(s, int)],
                      **check_vllm_kwargs(sampling.generation_kwargs, SamplingParams.__struct_fields__))
        return [SamplingParams(seed=s, **common) for s in seeds]

    @staticmethod
    def to_output(outs: list[Any]) -> RolloutOutput:
        completions, logprobs = [], []
        for out in outs:
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            completions.append(ids)
            logprobs.append([float(step[tok].logprob) for step, tok in zip(sample.logprobs, ids)])
        return RolloutOutput(completions, logprobs)

    def _check_lengths(self, prompt_ids: list[list[int]], max_tokens: int) -> None:
        longest = max(len(p) for p in prompt_ids)
        if longest + max_tokens > self.max_model_len:
            raise ValueError(f"a prompt of {longest} tokens + max_new_tokens {max_tokens} exceeds the engine's "
                             f"max_model_len={self.max_model_len}; raise max_model_len or set max_prompt_length")

    # ---------------------------------------------------------------- weights
    def sync_weights(self, weights: WeightSource, version: int, force: bool = False) -> None:
        """Called after every optimizer step; copies weights on multiples of ``sync_every``, or
        whenever ``force``d (a reference reset moved the policy)."""
        if force or version % self.sync_every == 0:
            self.load_weights(weights(), version)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace vLLM's weights with ``(hf_name, tensor)`` pairs from optimizer step ``version``."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])  # the KV cache stays released during training
        # In-process the iterator is consumed lazily (one merged tensor at a time); a spawned
        # engine process needs a picklable list.
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        weights = without_unserved_head(weights, self.served_head)
        weights = weights if in_process else list(weights)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        if self.asleep:
            self.llm.sleep(level=1)
        self.policy_version = int(version)
        self.syncs += 1

    # ---------------------------------------------------------------- memory
    def sleep(self) -> None:
        """Release the KV cache and offload weights between phases (CUDA only; else no-op)."""
        if self.can_sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut the engine down and free its memory (idempotent)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            try:
                if core is not None:
                    with keep_default_process_group(self._trainer_group):
                        core.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the object is dropped below anyway
                pass
            del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


def inspection(llm: Any) -> str | None:
    """vLLM's text view of its model (`checks.serves_lm_head`), None where it has none."""
    try:
        return llm.collective_rpc("get_model_inspection")[0]
    except Exception:  # noqa: BLE001 - an older vLLM without the inspection
        return None


@contextmanager
def keep_default_process_group(keep: bool):
    """vLLM's shutdown calls ``torch.distributed.destroy_process_group()``, which would take the
    trainer's own (DDP/FSDP) process group down with it; keep the default group when ``keep``."""
    if not keep:
        yield
        return
    destroy = torch.distributed.destroy_process_group

    def destroy_all_but_default(group=None):
        if group is not None:
            destroy(group)

    torch.distributed.destroy_process_group = destroy_all_but_default
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy
