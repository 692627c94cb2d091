"""`RemoteVLLMEngine`: a `RolloutEngine` over one or more vLLM servers (``vllm serve``).

Same `RolloutOutput` as the colocated `VLLMEngine`: completion ids (ending with EOS when the
model stopped) and each sampled token's ``processed_logprobs`` log-prob (the servers run with
``--logprobs-mode processed_logprobs``, see `rollout.vllm.engine` for why). Seeds: request ``i``
gets the same per-request seed as in the colocated and HF engines (`per_row.request_seeds`),
so a completion depends only on the module's seed stream, not on which server answered or how
many there are.

Weight versions: after a weight sync the engine sets every server's ``weight_version`` (vLLM's
``/update_weight_version``) to the optimizer step the weights come from; before every rollout it
reads ``/weight_info`` from each live server and refuses to sample when one differs from
``policy_version`` (a failed or partial update, or a server restarted with other weights).

Model check (`check_model`, before any weight is sent): the embedding table's rows (vLLM's
``get_model_inspection``; a smaller table passes the vocabulary probe, which checks the
tokenizer, then fails the first sync with a bare 500), the vocabulary (the last token id of the
trainer's vocabulary is accepted and the next one rejected as out of vocabulary), the number of
decoder layers (from the served parameter names), and the context (``max_model_len``).

Lost and returning servers: a server that cannot be reached during a sync is dropped and the sync
goes on with the others (it keeps an older or ``updating-<v>`` version, so it can never serve
mixed weights); before each sync dropped servers are probed, and those that answer get the full
sync, then a version check and the module's sampling-parity probe (``probe``, set by the callback;
`rollout.parity`) before they sample again; one that fails them is dropped again, with a warning.

Examples:
    >>> engine = RemoteVLLMEngine(["http://127.0.0.1:8000"], eos_token_id=2)  # doctest: +SKIP
    >>> engine.check_model(module.policy, module.tokenizer, needed_len=64)  # doctest: +SKIP
    >>> engine.load_weights(policy_weights(module.policy), 0)  # doctest: +SKIP
    >>> engine.generate([[1, 4, 5, 13]], module.sampling, seed=0).completion_ids  # doctest: +SKIP
"""
from __future__ import annotations

import logging
import re
import tempfile
import time
from typing import Any, Iterable

import torch

from ...http_client import HTTPFailure
from ..context import model_config
from ..engine import RolloutEngine, RolloutOutput, WeightSource
from ..sampling.generation_kwargs import check_server_kwargs
from ..ranks import lead_then_share
from ..sampling.per_row import request_seeds
from ..sampling import SamplingConfig
from ..servers.pool import ServerFailure, ServerPool
from .checks import serves_lm_head, without_unserved_head
from .engine import OVERRIDES
from .server import VLLMServer
from .transport import SnapshotTransport

log = logging.getLogger(__name__)


class RemoteVLLMEngine(RolloutEngine):
    """Sample from vLLM servers; send them the policy's weights every ``sync_every`` steps.

    Args:
        urls: server base URLs.
        eos_token_id: ends a completion (kept as its last token).
        transport: `SnapshotTransport` (default, in a temporary directory), `NCCLTransport`, or
            `AdapterTransport` (LoRA adapters; it sets ``pool.model`` to the adapter it loaded).
        servers: `VLLMServer` processes this engine owns (stopped by `close`).
        sync_every: optimizer steps between weight syncs (1 = on-policy).
        overrides: training-rollout sampling overrides (as `VLLMEngine`'s).
        tie_word_embeddings: write ``lm_head.weight`` into snapshots (tied heads, see transport).
        **pool_kwargs: `ServerPool`'s (``request_timeout``, ``control_timeout``, ``max_inflight``).

    ``last_sync`` holds ``{"bytes": ..., "seconds": ...}`` of the latest sync, ``where`` (set by
    the callback) names the trainer step in errors, ``pool.dead`` the servers that failed.
    """

    return_logprobs = True  # every completion comes with the sampled tokens' log-probs
    can_run_ahead = True  # the servers hold their own weights: a worker may sample while the trainer updates

    def __init__(self, urls: list[str], *, eos_token_id: int, transport: Any = None,
                 servers: list[VLLMServer] | None = None, sync_every: int = 1,
                 overrides: dict[str, Any] | None = None, tie_word_embeddings: bool = False, **pool_kwargs: Any):
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1 optimizer steps (got {sync_every}); 1 is on-policy")
        unknown = set(overrides or {}) - set(OVERRIDES)
        if unknown:
            raise ValueError(f"unknown sampling override(s) {sorted(unknown)}; known: {list(OVERRIDES)}")
        self.servers = list(servers or [])
        self.pool = ServerPool(urls, model="", **pool_kwargs)
        self.pool.model = self._served_model()
        self.eos_token_id, self.sync_every, self.tie_word_embeddings = eos_token_id, sync_every, tie_word_embeddings
        self.overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        self.transport = transport or SnapshotTransport.under(tempfile.gettempdir())
        self.policy_version, self.phase, self.syncs = 0, "training", 0
        self.max_model_len: int | None = None  # the servers' smallest context, once `check_model` read it
        self.last_sync: dict[str, float] = {}
        self.served_head = True  # the served model has an lm_head module (`check_model` reads it)
        self.probe: Any = None  # probe(url) raises when a server does not compute the policy's distribution

    @property
    def where(self) -> str:
        return self.pool.where

    @where.setter
    def where(self, value: str) -> None:
        self.pool.where = value

    def _served_model(self) -> str:
        names = {self.pool.get(url, "/v1/models")["data"][0]["id"] for url in self.pool.urls}
        if len(names) != 1:
            raise ValueError(f"the servers {self.pool.urls} serve different models {sorted(names)}; start them all "
                             "from the same model")
        return names.pop()

    # ---------------------------------------------------------------- start-up checks
    def check_model(self, policy: torch.nn.Module, tokenizer: Any, needed_len: int) -> None:
        """Refuse servers whose model cannot be the policy's (vocabulary, depth, context)."""
        config = model_config(policy)
        vocab = int(policy.get_input_embeddings().weight.shape[0]) if hasattr(policy, "get_input_embeddings") \
            else int(config.vocab_size)
        rows = vocab
        vocab = min(vocab, len(tokenizer))  # vLLM checks prompt ids against the tokenizer's vocabulary
        lengths = []
        for url in self.pool.urls:
            info = self.pool.get(url, "/v1/models")["data"][0]
            lengths.append(int(info.get("max_model_len") or 0))
            if lengths[-1] < needed_len:
                raise ValueError(f"vLLM server {url} has max_model_len={info.get('max_model_len')} < the {needed_len} "
                                 f"tokens the rollouts need; restart it with --max-model-len {needed_len} or more")
            served_rows = self._served_rows(url)
            if served_rows is not None and served_rows != rows:
                raise ValueError(f"vLLM server {url} serves {info['id']!r} with an embedding table of {served_rows} "
                                 f"rows, the policy's has {rows}: its weights cannot be loaded there. Start it from "
                                 "the policy's checkpoint (or launch=dict(...))")
            if self._torn(url):  # no forward pass may run on it before the first sync reloads the weights
                continue
            if not (self._accepts(url, vocab - 1) and not self._accepts(url, vocab)):
                raise ValueError(f"vLLM server {url} serves {info['id']!r}, whose vocabulary is not the policy's "
                                 f"{vocab} tokens (token id {vocab - 1} must be in it and {vocab} out): it runs a "
                                 "different model. Start it from the policy's checkpoint (or launch=dict(...))")
            self.served_head = self.served_head and serves_lm_head(self._inspection(url))
            layers = self._served_layers(url)
            if layers != int(config.num_hidden_layers):
                raise ValueError(f"vLLM server {url} serves a model with {layers} decoder layers, the policy has "
                                 f"{config.num_hidden_layers}: a different architecture. Start it from the policy's "
                                 "checkpoint (or launch=dict(...))")
        self.max_model_len = min(lengths)  # episodes stop (flagged) before a context the servers would refuse

    def _torn(self, url: str) -> bool:
        """Whether ``url`` holds weights an interrupted sync left partly reset: a trainer stopped
        after `SnapshotTransport.check_visible`'s failed probe reload (version
        ``checking-snapshot-dir``) or inside a reload (``updating-<step>``). A completion there
        runs on reset tensors and kills vLLM's engine (and the server with it), so the vocabulary
        probe is skipped for it; the first sync loads whole weights before anything samples."""
        held = self._held(url)
        if held == "checking-snapshot-dir" or held.startswith("updating-"):
            log.warning("vLLM server %s holds weight version %r: a run stopped in the middle of a weight sync, so "
                        "its weights may be partly reset. Not probing its vocabulary; the first sync reloads them "
                        "all before it samples", url, held)
            return True
        return False

    def _held(self, url: str) -> str:
        """The weight version ``url`` says it holds (vLLM's ``/weight_info``)."""
        return str(self.pool.get(url, "/weight_info").get("weight_version"))

    def _accepts(self, url: str, token_id: int) -> bool:
        body = {"model": self.pool.model, "prompt": [token_id], "max_tokens": 1}
        try:
            answer = self.pool.request("POST", url, "/v1/completions", body, self.pool.control_timeout)
        except HTTPFailure as err:
            raise ServerFailure(f"vLLM server {url} did not answer a vocabulary probe: {err}") from err
        if answer.status == 400 and "vocabulary" in answer.text:
            return False
        if answer.status != 200:
            raise ServerFailure(f"vLLM server {url} answered {answer.status} to a vocabulary probe: {answer.text[:300]}")
        return True

    def _inspection(self, url: str) -> str | None:
        """vLLM's text view of the served model, None when unreadable."""
        try:
            return self.pool.post(url, "/collective_rpc", {"method": "get_model_inspection"})["results"][0]
        except (ServerFailure, KeyError, IndexError, TypeError):
            return None

    def _served_rows(self, url: str) -> int | None:
        """Rows of the served input embedding (vLLM's model inspection), None when unreadable."""
        text = self._inspection(url)
        if text is None:
            return None
        found = re.search(r"num_embeddings=(\d+)", str(text))  # VocabParallelEmbedding's unpadded row count
        return int(found.group(1)) if found else None

    def _served_layers(self, url: str) -> int:
        names = self.pool.post(url, "/weight_checker", {"action": "checksum"})["checksums"]
        # Llama-style ``model.layers.N.``, GPT-2/Falcon-style ``transformer.h.N.``
        found = {int(m.group(1)) for n in names for m in [re.search(r"\.(?:layers|h)\.(\d+)\.", n)] if m}
        return max(found) + 1 if found else 0

    def parity_targets(self) -> dict[str, "RemoteVLLMEngine"]:
        """Each live server alone: the module's parity probe (`rollout.parity`) measures every one."""
        return {url: self._one_server(url) for url in self.pool.live}

    def _one_server(self, url: str) -> "RemoteVLLMEngine":
        """A view of this engine that sends every request to ``url`` only."""
        view = object.__new__(RemoteVLLMEngine)
        view.__dict__.update(self.__dict__)
        view.pool = object.__new__(ServerPool)
        view.pool.__dict__.update({**self.pool.__dict__, "urls": [url], "dead": {},
                                   "served": {url: 0}})
        return view

    # ---------------------------------------------------------------- generation
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int | list[int]) -> RolloutOutput:
        """Completions and sampled-token log-probs, after checking every server's weight version."""
        self.check_versions()
        sampling, stop = self.effective_sampling(sampling)
        seeds = request_seeds(seed, len(prompt_ids))
        common = dict(max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=sampling.top_k if sampling.top_k > 0 else -1, min_p=sampling.min_p,
                      repetition_penalty=sampling.repetition_penalty, logprobs=0, return_token_ids=True,
                      stop=[s for s in stop if isinstance(s, str)] or None,
                      stop_token_ids=[self.eos_token_id] + [s for s in stop if isinstance(s, int)],
                      **check_server_kwargs(sampling.generation_kwargs))  # fields the server would not ignore
        results = self.pool.complete([dict(prompt=list(p), seed=s, **common) for p, s in zip(prompt_ids, seeds)])
        return RolloutOutput([ids for ids, _ in results], [lps for _, lps in results])

    def effective_sampling(self, sampling: SamplingConfig) -> tuple[SamplingConfig, list[Any]]:
        from .engine import VLLMEngine

        return VLLMEngine.effective_sampling(self, sampling)  # same overrides, same rule (training only)

    def check_versions(self) -> None:
        """Every live server must hold ``policy_version``'s weights (`/weight_info`); one that
        cannot be reached is dropped while another is left."""
        for url in self.pool.live:
            try:
                held = self._held(url)
            except ServerFailure:
                if url in self.pool.dead and self.pool.live:  # lost, not wrong: the others sample
                    continue
                raise
            if held != str(self.policy_version):
                raise RuntimeError(
                    f"vLLM server {url} holds weight version {held!r} at {self.where}, but the trainer sent step "
                    f"{self.policy_version}: a weight update failed or was partial (or the server was restarted). "
                    "Not sampling from stale weights: check the server's log, then resume from the last checkpoint")

    # ---------------------------------------------------------------- weights
    def sync_weights(self, weights: WeightSource, version: int, force: bool = False) -> None:
        if force or version % self.sync_every == 0:
            self.load_weights(weights(), version)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Send ``(hf_name, tensor)`` pairs of optimizer step ``version`` to every live server.

        The servers' version reads ``updating-<version>`` until the load has finished on all of
        them and their prefix caches are reset, so an interrupted sync is caught by `check_versions`.
        Under DDP rank 0 alone sends; the other ranks wait for its outcome (`rollout.vllm.ranks`).
        """
        self.policy_version = int(version)
        self.last_sync, self.pool.model, live = lead_then_share(lambda: self._send(weights, version),
                                                                f"the weight sync of step {version}")
        self.pool.adopt(live)  # every rank samples from the servers rank 0 synced, and only those
        self.syncs += 1

    def _send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> tuple[dict[str, float], str, list]:
        start = time.perf_counter()
        back = self.pool.revive()  # dropped servers that answer again get this full sync, then the checks
        self.pool.post_all("/update_weight_version", {"new_version": f"updating-{version}"})
        weights = without_unserved_head(weights, self.served_head)  # a tied head vLLM computes from the embedding
        sent = self.transport.send(self.pool, weights, tie_word_embeddings=self.tie_word_embeddings and self.served_head,
                                   version=version)  # an AdapterTransport also sets pool.model
        self.pool.post_all("/reset_prefix_cache")  # cached KV blocks were computed with the old weights
        self.pool.post_all("/update_weight_version", {"new_version": str(version)})
        self._check_rejoined([url for url in back if url in self.pool.live], version)
        return {"bytes": sent, "seconds": time.perf_counter() - start}, self.pool.model, self.pool.live

    def _check_rejoined(self, urls: list[str], version: int) -> None:
        """A returning server samples again only once it holds ``version`` and passes the probe."""
        for url in urls:
            try:
                held = self._held(url)
                if held != str(version):
                    raise ValueError(f"it holds weight version {held!r} after the sync of step {version}")
                if self.probe is not None:
                    self.probe(url)
            except (ServerFailure, ValueError) as err:
                self.pool.drop(url, f"failed its checks after rejoining: {err}")

    def close(self) -> None:
        """Stop the servers this engine started (by pid) and remove the snapshot (idempotent)."""
        for server in self.servers:
            server.stop()
        self.servers = []
        if self.transport is not None:
            self.transport.close()
