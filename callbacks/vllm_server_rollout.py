"""`VLLMServerRollout`: sample rollouts from vLLM servers (``vllm serve``) instead of in-process."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import lightning as L
import torch

from lightning_rlpt.model.precision import precision_dtype
from lightning_rlpt.model.weights import policy_weights
from lightning_rlpt.rollout.context import context_length, model_config
from lightning_rlpt.rollout.ranks import lead_then_share
from lightning_rlpt.rollout.vllm.checks import check_head_dim, check_native_architecture
from lightning_rlpt.rollout.vllm.engine import export_model_dir, kv_cache_bytes, vllm_dtype
from lightning_rlpt.rollout.vllm.lora_transport import (LORA_SYNC_MODES, AdapterTransport, adapter_transport,
                                                        launch_lora_options)
from lightning_rlpt.rollout.vllm.ranks import check_strategy
from lightning_rlpt.rollout.vllm.reach import check_reachable
from lightning_rlpt.rollout.vllm.remote_engine import RemoteVLLMEngine
from lightning_rlpt.rollout.vllm.server import VLLMServer, sigterm_raises
from lightning_rlpt.rollout.vllm.transport import SnapshotTransport, write_snapshot

from .engine_callback import EngineCallback

LAUNCH_KEYS = ("num_servers", "max_model_len", "kv_cache_memory_bytes", "dtype", "startup_timeout", "extra_args",
               "log_dir", "seed", "env")


class VLLMServerRollout(EngineCallback):
    """Replace the module's rollout engine with a `RemoteVLLMEngine` over vLLM servers.

    Give ``urls`` of running servers (started from the policy's checkpoint with
    ``VLLM_SERVER_DEV_MODE=1`` and ``--logprobs-mode processed_logprobs``), or ``launch`` to
    start local ones at ``setup``: the policy's config and tokenizer are exported, ``num_servers``
    processes start at once on free loopback ports (logs in ``log_dir``, default
    ``<trainer.log_dir>/vllm``) and are stopped by pid at ``teardown`` or on an exception; if the
    trainer process ends otherwise (SIGKILL, a SIGTERM while they start), each server's guard ends
    its whole process group and removes the run's temporary folders (`rollout.vllm.guard`).
    Before any weight is sent the servers' model is checked against the policy (vocabulary,
    depth, context: `RemoteVLLMEngine.check_model`); then the current weights are sent and every
    ``sync_every``-th optimizer step sends them again (`rollout.vllm.transport`). Each rollout
    first checks that every live server holds the weight version the trainer sent. Requests are
    balanced over the servers by outstanding tokens; a server that dies or hangs is dropped and
    its requests go to the others, and when none is left the run stops with an error naming the
    servers and the step (`rollout.servers.pool`); a sync drops an unreachable server the same way,
    and dropped servers that answer again rejoin after a full sync, a version check and the parity
    probe. Drops, returns and requests waiting past ``warn_after`` are logged as warnings, and
    ``vllm/live_servers`` every step. A LoRA policy is synced as its adapter
    (``lora_sync``, `rollout.vllm.lora_transport`). Under DDP global rank 0 alone launches the
    servers and sends the weights, every rank samples its own rows (`rollout.vllm.ranks`);
    sharded strategies with several processes are refused.

    Args:
        urls: base URLs of running servers (``http://host:port``).
        launch: start local servers instead: ``dict(num_servers=1, max_model_len=None,
            kv_cache_memory_bytes=None, dtype=None, startup_timeout=300, extra_args=[],
            log_dir=None, seed=0, env={})``.
        sync_every: optimizer steps between weight syncs (1 = on-policy).
        request_timeout: seconds one completion may take before its server counts as hung.
        control_timeout: seconds for control calls (version, reload, health).
        max_inflight: completion requests in flight at once over all servers.
        warn_after: seconds a request may wait on a server before a warning names it (and the step).
        connect_timeout: seconds a new connection to a server may take (a host whose link is down sends
            no refusal: without this bound each request would wait the whole ``request_timeout``).
        transport: a transport object (default: `SnapshotTransport` in a temporary directory,
            `AdapterTransport` for a LoRA policy (see ``lora_sync``); pass ``NCCLTransport(...)`` for GPU
            servers: it is never chosen automatically).
        lora_sync: a LoRA policy's sync: ``"auto"`` (default) loads its adapter on the servers
            (``/v1/load_lora_adapter``; ``launch=`` adds ``--enable-lora``) when vLLM can serve it
            and sends merged weights otherwise (QLoRA, DoRA, ``modules_to_save``: see
            `rollout.vllm.lora_transport`); ``"adapter"`` insists; ``"merged"`` always merges.
        temperature / top_p / top_k / max_tokens / stop: training-rollout overrides, as `VLLMRollout`'s.
        validate: also use the servers for ``trainer.validate`` runs.
        parity_atol: replaced by the module's probe, which measures every server before the first
            training rollout and every ``parity_every`` syncs: ``RLModule(parity_threshold=...)``
            (docs/vllm.md, 'Sampling parity'). Only None is accepted.

    Examples:
        >>> trainer = L.Trainer(callbacks=[VLLMServerRollout(launch=dict(num_servers=2))])  # doctest: +SKIP
        >>> trainer = L.Trainer(callbacks=[VLLMServerRollout(urls=["http://10.0.0.7:8000"])])  # doctest: +SKIP
    """

    requires = EngineCallback.requires + ("policy", "val_sampling", "probe_rejoined")

    def __init__(self, *, urls: list[str] | None = None, launch: dict[str, Any] | None = None, sync_every: int = 1,
                 request_timeout: float = 600.0, control_timeout: float = 600.0, max_inflight: int = 64,
                 transport: Any = None, temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None, max_tokens: int | None = None, stop: list[Any] | None = None,
                 validate: bool = False, parity_atol: None = None, lora_sync: str = "auto",
                 max_staleness: int = 0, async_seed: int = 0, warn_after: float = 60.0,
                 connect_timeout: float = 10.0):
        if (urls is None) == (launch is None):
            raise ValueError("give exactly one of urls=[...] (running vLLM servers) or launch=dict(...) (start local "
                             f"ones); got urls={urls!r}, launch={launch!r}")
        if urls is not None and not urls:
            raise ValueError("urls is empty: list at least one server, e.g. urls=['http://127.0.0.1:8000']")
        unknown = set(launch or {}) - set(LAUNCH_KEYS)
        if unknown:
            raise ValueError(f"unknown launch option(s) {sorted(unknown)}; known: {list(LAUNCH_KEYS)}")
        if launch is not None and int(launch.get("num_servers", 1)) < 1:
            raise ValueError(f"launch num_servers must be >= 1 (got {launch['num_servers']})")
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1 optimizer steps (got {sync_every}); 1 is on-policy")
        if min(request_timeout, control_timeout, warn_after) <= 0:
            raise ValueError(f"request_timeout, control_timeout and warn_after must be > 0 seconds (got "
                             f"{request_timeout}, {control_timeout}, {warn_after})")
        if connect_timeout <= 0:
            raise ValueError(f"connect_timeout must be > 0 seconds (got {connect_timeout}): it bounds opening a "
                             "connection to a server, so a host whose link is down fails fast")
        if lora_sync not in LORA_SYNC_MODES:
            raise ValueError(f"lora_sync must be one of {LORA_SYNC_MODES} (got {lora_sync!r})")
        super().__init__(max_staleness=max_staleness, async_seed=async_seed, sync_every=sync_every)
        self.lora_sync = lora_sync
        self.urls, self.launch, self.sync_every, self.validate = urls, dict(launch or {}), sync_every, validate
        self.pool_kwargs = dict(request_timeout=request_timeout, control_timeout=control_timeout,
                                max_inflight=max_inflight, warn_after=warn_after,
                                connect_timeout=connect_timeout)
        if parity_atol is not None:
            raise ValueError(f"VLLMServerRollout(parity_atol={parity_atol!r}) is gone: the module's sampling-parity probe "
                             "measures every server now. Set RLModule(parity_threshold=...) (default 1e-2) instead")
        self.transport = transport
        self.overrides = {k: v for k, v in dict(temperature=temperature, top_p=top_p, top_k=top_k,
                                                 max_tokens=max_tokens, stop=stop).items() if v is not None}
        self._run_dir: str | None = None  # launch=: the export and the snapshots, removed with the servers

    # ---------------------------------------------------------------- start-up
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" and not (stage == "validate" and self.validate):
            return
        self.check_fit(trainer, pl_module)  # before any server is launched or contacted
        self._refuse_turn_budget_override(pl_module)
        config = model_config(pl_module.policy)
        check_native_architecture(config, "VLLMServerRollout")
        # Launched servers get the size to run with (episodes: the whole context); given ones must hold the minimum.
        needed = context_length(pl_module, self.launch.get("max_model_len"), self.overrides.get("max_tokens"), config,
                                minimum=not self.launch)
        check_strategy(trainer.strategy, trainer.world_size)
        transport = self.transport or adapter_transport(pl_module.policy, self.lora_sync)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        servers: list[VLLMServer] = []  # under DDP rank 0 launches them and shares the URLs (rollout.vllm.ranks)

        def launch() -> list[str]:
            nonlocal transport
            transport = self._run_folders(transport)
            with sigterm_raises():  # Lightning's own handler comes after setup
                servers.extend(self._launch(trainer, pl_module, needed, config, tied, transport))
            return [s.url for s in servers]

        urls = lead_then_share(launch, "launching the vLLM servers") if self.launch else list(self.urls)
        if transport is None and not self.launch:  # made here so that every rank's folder is checked below
            transport = SnapshotTransport.under(tempfile.gettempdir())
        try:
            # From every rank: one rank cut off (or unable to write its snapshot folder) would leave the others
            # in a collective.
            check_reachable(urls, local_problem=getattr(transport, "problem", None))
            engine = RemoteVLLMEngine(urls, eos_token_id=pl_module.tokenizer.eos_token_id, servers=servers,
                                           transport=transport, sync_every=self.sync_every,
                                           overrides=self.overrides, tie_word_embeddings=tied,
                                           **self.pool_kwargs)
        except BaseException:
            for server in servers:
                server.stop()
            if transport is not None:
                transport.close()
            raise
        # With max_staleness the module samples through a pipeline (EngineCallback); the callback drives `engine`.
        self.install(trainer, pl_module, engine)  # installed first, so a failed check still closes it
        engine.check_model(pl_module.policy, pl_module.tokenizer, needed)  # before any weight is sent

    def _launch(self, trainer: L.Trainer, module: L.LightningModule, needed: int, config: Any, tied: bool,
                transport: Any) -> list[VLLMServer]:
        check_head_dim(config, on_gpu=torch.cuda.is_available())
        dtype = vllm_dtype(self.launch.get("dtype") or precision_dtype(trainer.precision), module.policy)
        export_dir = export_model_dir(config, module.tokenizer, dtype, os.path.join(self._run_dir, "model"))
        log_dir = self.launch.get("log_dir") or os.path.join(trainer.log_dir or trainer.default_root_dir, "vllm")
        # The current weights go in as the checkpoint (vLLM cannot reload in place into a dummy-loaded model);
        # with adapters on the servers, the base alone (and the flags and environment LoRA serving needs).
        lora_args, lora_env, weights = launch_lora_options(module.policy, transport)
        write_snapshot(export_dir, weights, dtype=dtype, tie_word_embeddings=tied)
        extra = lora_args + list(self.launch.get("extra_args", []))
        kv = self.launch.get("kv_cache_memory_bytes") or kv_cache_bytes(config, dtype, needed)
        return VLLMServer.launch_many(
            export_dir, int(self.launch.get("num_servers", 1)), log_dir=log_dir, remove=[self._run_dir],
            startup_timeout=float(self.launch.get("startup_timeout", 300.0)),
            env={**lora_env, **(self.launch.get("env") or {})},
            dtype=str(dtype).replace("torch.", ""), max_model_len=needed, kv_cache_memory_bytes=kv,
            seed=int(self.launch.get("seed", 0)), extra_args=extra)

    def _run_folders(self, transport: Any) -> Any:
        """One temporary folder per launch holds the export and the snapshots, so the servers' guard
        can remove it all; returns the transport, writing there unless the user chose its folder."""
        self._run_dir = tempfile.mkdtemp(prefix="rlpt-serve-")
        if transport is None:
            return SnapshotTransport(os.path.join(self._run_dir, "weights"))
        if isinstance(transport, AdapterTransport) and transport.directory is None:
            transport.directory = os.path.join(self._run_dir, "adapters")
            os.makedirs(transport.directory)
        return transport

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After setup, and after a checkpoint (ckpt_path=...) is restored: send the weights as they are now.
        if self.engine is None:
            return
        self.engine.load_weights(policy_weights(pl_module.policy), pl_module.policy_version)
        # The module's parity probe measures every server before the first training rollout (and every
        # parity_every syncs); a server that returns after a drop passes the same probe before it samples again.
        engine = self.engine
        engine.probe = lambda url: pl_module.probe_rejoined(engine._one_server(url))

    # ---------------------------------------------------------------- phases (EngineCallback: the pipeline, the
    # engine's phase and step, a sync before validation; the module: staleness, checked and logged)
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self.engine is not None:
            pl_module.log("vllm/weight_sync_bytes", float(self.engine.last_sync.get("bytes", 0.0)))
            pl_module.log("vllm/live_servers", float(len(self.engine.pool.live)))

    # ---------------------------------------------------------------- shutdown (EngineCallback releases;
    # the engine's close() stops the servers it launched, by pid)
    def cleanup(self) -> None:
        if self._run_dir:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
