"""LoRA adapters on vLLM servers: send the adapter after an optimizer step, not merged weights.

A LoRA policy trains ``r · (d_in + d_out)`` numbers per adapted matrix; the base stays frozen.
`AdapterTransport` therefore leaves the servers' base model alone (they start from it) and
sends only the adapter, as vLLM's LoRA serving loads it:

1. the active peft adapter is written to a fresh directory, ``adapter_model.safetensors``
   (``peft.get_peft_model_state_dict``: ``lora_A``/``lora_B`` under peft's names) and
   ``adapter_config.json``;
2. each live server loads it under a versioned name, ``policy-v<step>``, with
   ``POST /v1/load_lora_adapter`` (needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and
   ``--enable-lora --max-lora-rank R``), then the previous adapter's name is unloaded
   (``/v1/unload_lora_adapter``);
3. completions name the adapter as their ``model`` (``pool.model``), so a request can only
   reach the weights of the step the engine synced; vLLM's weight-version protocol
   (``updating-<v>`` → ``<v>``, checked by ``/weight_info`` before every rollout) still wraps
   the whole send (`RemoteVLLMEngine.load_weights`).

Why a new name each step and not ``load_inplace``: in vLLM 0.32 an adapter registered with
``load_inplace=True`` keeps that flag, and its worker reloads it from disk at every scheduler
step (``LRUCacheWorkerLoRAManager.add_adapter``); a new name gets a new adapter id, loaded once,
and the LRU cache (``--max-cpu-loras``, default ``--max-loras`` = 1) evicts the old one. A re-sync
of the same step (fit start, validation) unloads the name first, then loads it again; a new
transport (a resumed run) first unloads the ``<prefix>-v*`` adapters an earlier run left.

Bytes per sync (``last_sync["bytes"]``, logged as ``vllm/weight_sync_bytes``) are the adapter's
tensor bytes, Σ (numel × element size) over ``lora_A``/``lora_B``: on the demo (2 layers × 128,
r = 4, fp32) 69,632 bytes instead of the 1,328,640 of merged weights.

What stays merged (`lora_sync_mode`, ``"auto"``): QLoRA (the adapter was trained against the
4-bit base; vLLM 0.32 has no bitsandbytes weight loader, so a server cannot hold that base, and a
full-precision base would give another distribution), DoRA, LoRA biases and ``modules_to_save``
(vLLM's adapter loader refuses them), and ranks above 512 (vLLM's largest ``--max-lora-rank``).

Examples:
    >>> transport = AdapterTransport("/tmp/run/adapters", module.policy)  # doctest: +SKIP
    >>> transport.send(pool, [], tie_word_embeddings=False, version=3)  # doctest: +SKIP
    69632
    >>> pool.model  # doctest: +SKIP
    'policy-v3'
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Iterable, Iterator

import torch

from ..servers.pool import ServerFailure, ServerPool
from .run_folder import owned_folder, release
from .transport import tensor_bytes

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's allowed --max-lora-rank values
RUNTIME_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}  # mounts /v1/load_lora_adapter
LORA_SYNC_MODES = ("auto", "adapter", "merged")


def _config(policy: torch.nn.Module) -> Any:
    return policy.peft_config[policy.active_adapter]


def lora_rank(policy: torch.nn.Module) -> int:
    """The largest rank of the active adapter (``r`` and ``rank_pattern``)."""
    config = _config(policy)
    return max([int(config.r), *(int(r) for r in (getattr(config, "rank_pattern", None) or {}).values())])


def adapter_problem(policy: torch.nn.Module) -> str | None:
    """Why vLLM servers cannot run this policy's adapter on its base, or None when they can."""
    if not (hasattr(policy, "peft_config") and hasattr(policy, "active_adapter")):
        return "the policy has no peft LoRA adapter"
    config = _config(policy)
    if type(config).__name__ != "LoraConfig":
        return f"the adapter is a {type(config).__name__}, not LoRA"
    if any(type(p).__name__ in ("Params4bit", "Int8Params") for p in policy.parameters()):
        return ("QLoRA: the adapter was trained against a bitsandbytes-quantised base, which vLLM 0.32 cannot "
                "load (no bitsandbytes weight loader), and a full-precision base computes another distribution")
    if getattr(config, "use_dora", False):
        return "DoRA adapters are not loaded by vLLM"
    if getattr(config, "lora_bias", False) or getattr(config, "bias", "none") != "none":
        return "LoRA biases are not loaded by vLLM"
    if getattr(config, "modules_to_save", None):
        return f"modules_to_save={config.modules_to_save} is not loaded by vLLM"
    if lora_rank(policy) > MAX_LORA_RANKS[-1]:
        return f"rank {lora_rank(policy)} is above vLLM's largest --max-lora-rank ({MAX_LORA_RANKS[-1]})"
    return None


def lora_sync_mode(policy: torch.nn.Module, mode: str) -> str:
    """``"adapter"``, ``"merged"`` or ``"full"`` (not a LoRA policy) for ``lora_sync=mode``.

    ``"auto"`` sends the adapter whenever `adapter_problem` finds nothing against it, merged
    weights otherwise; ``"adapter"`` insists (an error says why it cannot); ``"merged"`` always
    sends merged weights (servers without ``--enable-lora``).
    """
    if mode not in LORA_SYNC_MODES:
        raise ValueError(f"lora_sync must be one of {LORA_SYNC_MODES} (got {mode!r})")
    if not hasattr(policy, "peft_config"):
        return "full"
    problem = adapter_problem(policy)
    if mode == "adapter" and problem:
        raise ValueError(f"lora_sync='adapter' cannot serve this policy's adapter on vLLM: {problem}. Use "
                         "lora_sync='merged' (merged weights are sent; servers need no --enable-lora)")
    return "merged" if mode == "merged" or problem else "adapter"


def server_lora_args(policy: torch.nn.Module) -> list[str]:
    """The ``vllm serve`` flags an adapter of this policy needs (rank rounded up to an allowed value)."""
    rank = next(r for r in MAX_LORA_RANKS if r >= lora_rank(policy))
    return ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "1"]


def adapter_transport(policy: torch.nn.Module, mode: str) -> "AdapterTransport | None":
    """The transport ``lora_sync=mode`` asks for: an `AdapterTransport` (in a temporary
    directory, made at the first send) when adapters are served, None for merged or full weights."""
    return AdapterTransport(None, policy) if lora_sync_mode(policy, mode) == "adapter" else None


def launch_lora_options(policy: torch.nn.Module, transport: Any) -> tuple[list[str], dict[str, str], Any]:
    """``(extra vllm serve args, environment, weights of the launch checkpoint)`` for servers
    that ``transport`` will feed: with an `AdapterTransport` the LoRA flags and the base weights
    (adapters disabled: the adapter is applied by the server); otherwise none and merged weights."""
    from lightning_rlpt.model.weights import policy_weights

    if isinstance(transport, AdapterTransport):
        return server_lora_args(policy), dict(RUNTIME_ENV), base_weights(policy)
    return [], {}, policy_weights(policy)


def base_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's ``(hf_name, tensor)`` pairs (adapters disabled while they are read)."""
    from lightning_rlpt.model.weights import policy_weights

    with policy.disable_adapter():
        yield from policy_weights(policy)


def write_adapter(directory: str, policy: torch.nn.Module, dtype: torch.dtype | None = None) -> int:
    """``adapter_model.safetensors`` + ``adapter_config.json`` of the active adapter; returns tensor bytes."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    name = policy.active_adapter
    state = get_peft_model_state_dict(policy, adapter_name=name)
    tensors = {k: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().to("cpu", dtype or t.dtype)
               .contiguous() for k, t in state.items()}
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    policy.peft_config[name].save_pretrained(directory)
    return tensor_bytes(tensors.values())


class AdapterTransport:
    """Send the policy's LoRA adapter to every live server and serve it (module docstring).

    Args:
        directory: where adapters are written (must be readable by the servers; None: a folder of
            the run's own in the temporary directory, made at the first send, `rollout.vllm.run_folder`).
        policy: the peft LoRA policy whose active adapter is sent.
        dtype: the dtype written (None keeps the adapter's; vLLM casts to its own dtype).
        prefix: adapter names are ``<prefix>-v<step>``.

    ``model`` is the adapter name the servers serve after the latest send (None before).
    """

    def __init__(self, directory: str | None, policy: torch.nn.Module, dtype: torch.dtype | None = None,
                 prefix: str = "policy"):
        problem = adapter_problem(policy)
        if problem:
            raise ValueError(f"AdapterTransport cannot serve this policy's adapter on vLLM: {problem}")
        self.directory, self.policy, self.dtype, self.prefix = directory, policy, dtype, prefix
        self.model: str | None = None
        self.sends = 0
        self.holders: set[str] = set()  # servers holding self.model (loaded by this transport)

    def send(self, pool: ServerPool, weights: Iterable[tuple[str, torch.Tensor]] = (), *,
             tie_word_embeddings: bool = False, version: int = 0) -> int:
        """Write the adapter, load it on every live server; ``pool.model`` names it. Returns
        the adapter's tensor bytes. ``weights`` (merged tensors) is not iterated, so not computed."""
        self.directory = self.directory or owned_folder(tempfile.gettempdir(), "rlpt-adapters-", "adapter directory")
        name, path = f"{self.prefix}-v{version}", os.path.join(self.directory, f"{self.sends}")
        shutil.rmtree(path, ignore_errors=True)
        sent = write_adapter(path, self.policy, self.dtype)
        previous, self.sends = self.model, self.sends + 1
        for url in pool.live:
            try:
                self._load(pool, url, name, path, previous if url in self.holders else None)
            except ServerFailure:
                if url not in pool.dead:
                    raise
                self.holders.discard(url)  # lost (dropped by the pool): the others go on
        if not pool.live:
            raise ServerFailure(pool.failure("no vLLM server is left to load the adapter"))
        pool.model, self.model = name, name
        for old in os.listdir(self.directory):  # the servers hold earlier adapters in memory, not on disk
            if old != os.path.basename(path):
                shutil.rmtree(os.path.join(self.directory, old), ignore_errors=True)
        return sent

    def _load(self, pool: ServerPool, url: str, name: str, path: str, previous: str | None) -> None:
        """Load adapter ``name`` on ``url``; ``previous`` is what this transport last loaded there."""
        if previous is None:  # a new trainer (a resume) or a returning server: adapters left there block our names
            for stale in self._ours(pool, url):
                self._call(pool, url, "/v1/unload_lora_adapter", {"lora_name": stale})
        elif previous == name:  # the same step again: its name is taken, free it (see module docstring)
            self._call(pool, url, "/v1/unload_lora_adapter", {"lora_name": name})
        self._call(pool, url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if previous not in (None, name):
            self._call(pool, url, "/v1/unload_lora_adapter", {"lora_name": previous})
        self.holders.add(url)

    def _ours(self, pool: ServerPool, url: str) -> list[str]:
        names = [m["id"] for m in pool.get(url, "/v1/models")["data"]]
        return [n for n in names if n.startswith(f"{self.prefix}-v")]

    def _call(self, pool: ServerPool, url: str, route: str, body: dict[str, Any]) -> None:
        try:
            pool.post(url, route, body)
        except ServerFailure as err:
            if url in pool.dead:  # unreachable: the pool's own error already names it
                raise
            if "No adapter found for" in str(err):  # vLLM's LoRAAdapterNotFoundError: the path, not the flags
                raise ValueError(
                    f"vLLM server {url} cannot read the LoRA adapter folder {body.get('lora_path')} the trainer wrote "
                    f"({route} at {pool.where}: {err}). Trainer and servers must see the same files at the same path: "
                    "pass VLLMServerRollout(transport=AdapterTransport('/shared/run/adapters', module.policy)) on a "
                    "filesystem every trainer and rollout host mounts (NFS, Lustre, ...), or lora_sync='merged' with "
                    "transport=SnapshotTransport('/shared/run/weights')") from err
            rank = lora_rank(self.policy)
            raise ValueError(
                f"vLLM server {url} refused the LoRA adapter (rank {rank}) on {route} at {pool.where}: {err}. Start "
                f"it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and {' '.join(server_lora_args(self.policy))} "
                "(launch=dict(...) does this), or pass lora_sync='merged' to send merged weights instead") from err

    def close(self) -> None:
        if self.directory:
            release(self.directory)
