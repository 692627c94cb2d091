"""`RemoteVLLMEngine`: a `RolloutEngine` over one or more vLLM servers (``vllm serve``).

Same `RolloutOutput` as the colocated `VLLMEngine`: completion ids (ending with EOS when the
model stopped) and each sampled token's ``processed_logprobs`` log-prob (the servers run with
``--logprobs-mode processed_logprobs``, see `rollout.vllm.engine` for why). Seeds: request ``i``
gets the same per-request seed as in the colocated and HF engines (`row_sampling.request_seeds`),
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
sync, then a version check and the parity probe (``probe``, set by the callback) before they
sample again; one that fails them is dropped again, with a warning.

Example:
    >>> engine = RemoteVLLMEngine(["http://127.0.0.1:8000"], eos_token_id=2)  # doctest: +SKIP
    >>> engine.check_model(module.policy, module.tokenizer, needed_len=64)  # doctest: +SKIP
    >>> engine.load_weights(policy_weights(module.policy), 0)  # doctest: +SKIP
    >>> engine.generate([[1, 4, 5, 13]], module.sampling, seed=0).completion_ids  # doctest: +SKIP
"""
from __future__ import annotations

import re
import tempfile
import time
from typing import Any, Iterable

import torch

from ..context import model_config
from ..engine import RolloutEngine, RolloutOutput, WeightSource
from ..generation_kwargs import check_server_kwargs
from ..ranks import lead_then_share
from ..row_sampling import request_seeds
from ..sampling import SamplingConfig
from ..server_pool import ServerFailure, ServerPool
from .engine import OVERRIDES
from .server import VLLMServer
from .transport import SnapshotTransport


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
        self.transport = transport or SnapshotTransport(tempfile.mkdtemp(prefix="rlpt-weights-"))
        self.policy_version, self.phase, self.syncs = 0, "training", 0
        self.max_model_len: int | None = None  # the servers' smallest context, once `check_model` read it
        self.last_sync: dict[str, float] = {}
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
            if not (self._accepts(url, vocab - 1) and not self._accepts(url, vocab)):
                raise ValueError(f"vLLM server {url} serves {info['id']!r}, whose vocabulary is not the policy's "
                                 f"{vocab} tokens (token id {vocab - 1} must be in it and {vocab} out): it runs a "
                                 "different model. Start it from the policy's checkpoint (or launch=dict(...))")
            layers = self._served_layers(url)
            if layers != int(config.num_hidden_layers):
                raise ValueError(f"vLLM server {url} serves a model with {layers} decoder layers, the policy has "
                                 f"{config.num_hidden_layers}: a different architecture. Start it from the policy's "
                                 "checkpoint (or launch=dict(...))")
        self.max_model_len = min(lengths)  # episodes stop (flagged) before a context the servers would refuse

    def _accepts(self, url: str, token_id: int) -> bool:
        import requests

        body = {"model": self.pool.model, "prompt": [token_id], "max_tokens": 1}
        resp = requests.post(url + "/v1/completions", json=body, timeout=self.pool.control_timeout)
        if resp.status_code == 400 and "vocabulary" in resp.text:
            return False
        if resp.status_code != 200:
            raise ServerFailure(f"vLLM server {url} answered {resp.status_code} to a vocabulary probe: {resp.text[:300]}")
        return True

    def _served_rows(self, url: str) -> int | None:
        """Rows of the served input embedding (vLLM's model inspection), None when unreadable."""
        try:
            text = self.pool.post(url, "/collective_rpc", {"method": "get_model_inspection"})["results"][0]
        except (ServerFailure, KeyError, IndexError, TypeError):
            return None
        found = re.search(r"num_embeddings=(\d+)", str(text))  # VocabParallelEmbedding's unpadded row count
        return int(found.group(1)) if found else None

    def _served_layers(self, url: str) -> int:
        names = self.pool.post(url, "/weight_checker", {"action": "checksum"})["checksums"]
        # Llama-style ``model.layers.N.``, GPT-2/Falcon-style ``transformer.h.N.``
        found = {int(m.group(1)) for n in names for m in [re.search(r"\.(?:layers|h)\.(\d+)\.", n)] if m}
        return max(found) + 1 if found else 0

    @torch.no_grad()
    def check_parity(self, policy: torch.nn.Module, prompt: list[int], atol: float = 1e-3, tokens: int = 4,
                     urls: list[str] | None = None) -> float:
        """After a sync, every live server's greedy tokens for ``prompt`` must be the policy's
        argmax and their log-probs within ``atol`` of the policy's: the served model computes
        what the policy computes (catches another architecture that accepted the weights, or a
        head the reload left stale). ``urls``: only these servers (default: every live one).
        Returns the largest |Δ log p|.
        """
        greedy = SamplingConfig(max_new_tokens=tokens, temperature=0.0)
        worst = 0.0
        for url in self.pool.live if urls is None else urls:
            out = RemoteVLLMEngine._one_server(self, url).generate([prompt], greedy, 0)
            ids = torch.tensor([prompt + out.completion_ids[0]], device=next(policy.parameters()).device)
            was_training = policy.training
            policy.eval()
            logits = policy(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
            policy.train(was_training)
            expected = logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1).cpu()
            diff = (expected - torch.tensor(out.logprobs[0])).abs().max().item()
            argmax_ok = torch.equal(logits.argmax(-1).cpu(), ids[0, len(prompt):].cpu())
            if diff > atol or not argmax_ok:
                raise ValueError(f"vLLM server {url} ({self.pool.model!r}) does not compute the policy's "
                                 f"distribution after a weight sync: greedy tokens {out.completion_ids[0]} "
                                 f"{'are' if argmax_ok else 'are not'} the policy's argmax, |Δ log p| = {diff:.3g} > "
                                 f"{atol}. It runs a different model (architecture or head): start it from the "
                                 "policy's checkpoint (or launch=dict(...))")
            worst = max(worst, diff)
        return worst

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
                held = self.pool.get(url, "/weight_info")["weight_version"]
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
        sent = self.transport.send(self.pool, weights, tie_word_embeddings=self.tie_word_embeddings,
                                   version=version)  # an AdapterTransport also sets pool.model
        self.pool.post_all("/reset_prefix_cache")  # cached KV blocks were computed with the old weights
        self.pool.post_all("/update_weight_version", {"new_version": str(version)})
        self._check_rejoined([url for url in back if url in self.pool.live], version)
        return {"bytes": sent, "seconds": time.perf_counter() - start}, self.pool.model, self.pool.live

    def _check_rejoined(self, urls: list[str], version: int) -> None:
        """A returning server samples again only once it holds ``version`` and passes the probe."""
        for url in urls:
            try:
                held = self.pool.get(url, "/weight_info")["weight_version"]
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
