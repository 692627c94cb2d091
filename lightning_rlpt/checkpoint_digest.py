"""A CRC32 of every part of a checkpoint that is not the module's weights (those have their own,
`checkpoint.tensor_checksums`): optimizer moments and step counts, schedulers, loops, callbacks,
loaders, RNG states, hyper-parameters and ``lightning_rlpt``'s own counters.

Why: a bit flip in the optimizer state (Adam's ``step`` 5 → 2.1e10, an ``exp_avg``) loaded and
trained on silently, since torch reads no CRC back. Each tensor is a part of its own, named by
its path (``optimizer_states.0.state.3.exp_avg``); a value that is not a tensor is part of its
nearest named container. Objects are checked by their type only (their bytes are not stable
across processes: a set's order, an address in a repr), so the check never refuses a good file.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import numpy as np
import torch

OWN_KEYS = ("checksums", "state_checksums")  # the checksums themselves, inside checkpoint["lightning_rlpt"]
SKIPPED = ("state_dict", "pytorch-lightning_version")  # covered by `checksums`; rewritten by Lightning's migrations
PRIMITIVES = (type(None), bool, int, float, complex, str, bytes)


def state_checksums(checkpoint: dict[str, Any]) -> dict[str, int]:
    """``{path: crc32}`` of every part of ``checkpoint`` (see the module docstring).

    Examples:
        >>> sums = state_checksums({"optimizer_states": [{"state": {0: {"step": torch.tensor(5.0)}}}]})
        >>> list(sums)
        ['optimizer_states.0.state.0.step']
    """
    out: dict[str, int] = {}
    for key, value in checkpoint.items():
        if key in SKIPPED:
            continue
        if key == "lightning_rlpt" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in OWN_KEYS}
        _walk(value, str(key), out, set())
    return out


def _walk(value: Any, path: str, out: dict[str, int], seen: set[int]) -> None:
    """Tensors and arrays: a CRC each; containers: walked; other values: into their container's CRC."""
    if isinstance(value, torch.Tensor):
        if not hasattr(value, "full_tensor"):  # a sharded DTensor: each rank holds a shard
            out[path] = _tensor_crc(value)
        return
    if isinstance(value, np.ndarray):
        out[path] = zlib.crc32(np.ascontiguousarray(value).tobytes(), zlib.crc32(repr((value.dtype, value.shape)).encode()))
        return
    children = _children(value)
    if children is None or id(value) in seen:
        out[path] = zlib.crc32(_describe(value).encode(), out.get(path, 0))
        return
    seen.add(id(value))
    for key, child in children:
        _walk(child, f"{path}.{key}", out, seen)
    if not children:  # an empty container is a part too (a state that lost its entries)
        out[path] = zlib.crc32(repr(type(value).__name__).encode())


def _children(value: Any) -> list[tuple[Any, Any]] | None:
    """The parts of a container, in a stable order; None for a leaf."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (list, tuple)):  # one part for a list of plain values (a history of floats)
        return None if all(isinstance(v, PRIMITIVES) for v in value) else list(enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return None


def _describe(value: Any) -> str:
    """A leaf as text that is the same in every process that loads it."""
    if isinstance(value, PRIMITIVES) or isinstance(value, (list, tuple)):  # lists: of plain values only
        return repr(value)
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({sorted(map(_describe, value))})"
    if isinstance(value, torch.dtype | torch.device):
        return str(value)
    return f"<{type(value).__module__}.{getattr(value, '__qualname__', type(value).__qualname__)}>"


def _tensor_crc(tensor: torch.Tensor) -> int:
    data = tensor.detach().cpu().contiguous().reshape(-1)
    meta = zlib.crc32(repr((str(tensor.dtype), tuple(tensor.shape))).encode())
    return zlib.crc32(data.view(torch.uint8).numpy(), meta) if data.numel() else meta


def verify_state_checksums(saved: dict[str, int], checkpoint: dict[str, Any], path: str | None) -> None:
    """Refuse a checkpoint whose parts no longer give the CRC32s written at save, naming them.
    Parts added or removed since (an older or edited checkpoint) are not compared."""
    now = state_checksums(checkpoint)
    bad = [name for name, crc in saved.items() if name in now and now[name] != crc]
    if bad:
        where = repr(path) if path else "this checkpoint"
        raise ValueError(f"{where}: part(s) {bad[:5]}{' and more' if len(bad) > 5 else ''} do not match the checksum "
                         "written when the checkpoint was saved, so they changed on disk or in a copy (a bit flip in "
                         "the optimizer state trains on silently). Resume from the previous checkpoint or copy this "
                         "one again from its source; if you edited it on purpose, delete "
                         "checkpoint['lightning_rlpt']['state_checksums'] to accept the edit")
