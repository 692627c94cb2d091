"""Chaos driver for tests/durability: imports torch and a checkpoint IO once, then for each trial
forks a real process that saves checkpoints in a loop (``step=N.ckpt`` then ``last.ckpt``, as
``ModelCheckpoint(save_last=True)`` does) and kills it with SIGKILL after a random delay.

    python saver.py IO CKPT_DIR TRIALS SEED MAX_DELAY_S   # IO: atomic | lightning

Prints one JSON line: the delays used. The checks run in the test, on the files left behind.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import torch

MEGABYTES = 2  # a tiny model's checkpoint: each save takes a few milliseconds to tens of them


def state(step: int) -> dict:
    """What step ``step`` saves: a weight and optimizer moments seeded by the step, plus loop state."""
    g = torch.Generator().manual_seed(step)
    n = MEGABYTES * 2**20 // 4 // 3
    return {"step": step, "state_dict": {"w": torch.randn(n, generator=g)},
            "optimizer_states": [{"state": {0: {"exp_avg": torch.randn(n, generator=g), "step": torch.tensor(float(step))},
                                            1: {"exp_avg_sq": torch.rand(n, generator=g)}}}],
            "loops": {"fit_loop": {"consumed": step, "epoch": 0}}}


def make_io(kind: str):
    if kind == "atomic":
        from lightning_rlpt.checkpoint_io import AtomicCheckpointIO
        return AtomicCheckpointIO()
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    return TorchCheckpointIO()


def save_forever(io, directory: str, first: int) -> None:
    for step in range(first, first + 10_000):
        checkpoint = state(step)
        io.save_checkpoint(checkpoint, os.path.join(directory, f"step={step}.ckpt"))
        io.save_checkpoint(checkpoint, os.path.join(directory, "last.ckpt"))
        # Keep the newest two step files, as ModelCheckpoint(save_top_k=...) prunes: a fast machine saves
        # ~100 per trial, and a full tmpfs would end the saver (ENOSPC) before later trials' kills land.
        stale = os.path.join(directory, f"step={step - 2}.ckpt")
        if os.path.exists(stale):
            io.remove_checkpoint(stale)


def main() -> None:
    kind, directory, trials, seed, max_delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    io, rng, delays = make_io(kind), random.Random(seed), []
    for trial in range(trials):
        trial_dir = os.path.join(directory, f"trial{trial}")
        os.makedirs(trial_dir, exist_ok=True)
        pid = os.fork()
        if pid == 0:  # the saver: a real process, killed mid-save
            try:
                save_forever(io, trial_dir, 1)
            finally:
                os._exit(0)
        delay = rng.uniform(0.0, max_delay)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        delays.append(round(delay, 4))
    print(json.dumps({"delays": delays}))


if __name__ == "__main__":
    main()
