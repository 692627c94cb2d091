"""Every seed the package derives from another: one keyed hash and one generator built on it.

A derived seed is a function of its key alone: the run's ``seed`` and integers naming the
draw (rank, rollout count, row, turn, ...). Nothing is carried from one draw to the next, so a
resumed run needs only the counts to draw what the straight run drew, and two ranks or two
callbacks never share a stream by accident. Each stream is named by a ``domain`` string that is
part of the key: ``keyed_seed("row", 3, 0)`` and ``keyed_seed("turn", 3, 0)`` are unrelated.

The domains in use (one place to see them all):

========================  ===================================================  ================================
domain                    key                                                  drawn by
========================  ===================================================  ================================
``rollout``               seed, rank, rollout draw                             `RLModule` (each rollout's seed)
``row``                   rollout seed, row                                    `rollout.collect.row_seeds`
``prompt``                rollout seed, dataset index, occurrence, group row   ``seed_per_prompt`` rows
``turn``                  row seed, turn (>= 1)                                `rollout.episodes.loop.turn_seed`
``ahead``                 async seed, batch count                              `rollout.pipeline.RolloutPipeline`
``validation``            seed, validation batch                               `RLModule.validation_step`
``callback/<name>``       callback seed, its counters                          the seed-method callbacks
========================  ===================================================  ================================

Not derived here, on purpose: the data order is seeded by ``seed + epoch`` (torch's
``DistributedSampler`` convention, so an order matches the one a Lightning user already gets)
and `rollout.sampling.per_row.request_seeds` draws a call's row seeds from a generator seeded by the
call's seed.

Examples:
    >>> keyed_seed("row", 3, 0) == keyed_seed("row", 3, 0) != keyed_seed("turn", 3, 0)
    True
    >>> 0 <= keyed_seed("rollout", 2**70, 1, 5) < 2**62
    True
"""
from __future__ import annotations

import hashlib

import torch

VERSION = 2  # written in checkpoints; 1 (absent): the derivations before this module (see `checkpoint.load_state`)


def keyed_seed(domain: str, *key: int) -> int:
    """A seed in ``[0, 2**62)`` determined by ``domain`` and the integers ``key`` alone: the
    first 8 bytes of the SHA-256 of their ``repr``, big-endian, top 62 bits (below 2**63, so a
    torch generator or a vLLM ``SamplingParams.seed`` takes it; below 2**62, so row seeds stay
    exact in the HF sampler's int64 hash)."""
    if not isinstance(domain, str) or not domain:
        raise TypeError(f"keyed_seed's first argument names the stream (a non-empty str), got {domain!r}")
    digest = hashlib.sha256(repr((domain, *(int(k) for k in key))).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def keyed_generator(domain: str, *key: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by `keyed_seed` ``(domain, *key)``."""
    return torch.Generator().manual_seed(keyed_seed(domain, *key))
