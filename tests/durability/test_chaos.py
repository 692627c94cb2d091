"""Issue 37 item 5: SIGKILL at random moments of checkpoint saves, with the checkpoint directory
and ``$TMPDIR`` on two filesystems (a tmpfs mounted for the test), and full disks on each side.

Each trial is a real process (forked by `saver.py`, which imports torch once) saving 2 MB
checkpoints in a loop (``step=N.ckpt`` then ``last.ckpt``), killed with SIGKILL after a random
delay. After it: every checkpoint under its final name loads, verified, with exactly the state
of its step; ``last.ckpt`` is the newest step or the one before; nothing is left in ``$TMPDIR``;
the temp of the killed save is removed at the next start.

Seen failing with Lightning's own IO (``python tests/durability/saver.py lightning DIR 10 1 0.5``
with DIR on /dev/shm and $TMPDIR on /): torn or empty ``last.ckpt`` files and 2 MB orphans in
$TMPDIR (5 of 10 kills); a full checkpoint disk left a partial ``step=2.ckpt``.
"""
import errno
import glob
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
from filesystems import mounted_tmpfs, other_filesystem  # noqa: F401  (a fixture)

from lightning_rlpt.checkpoint_io import TEMP_SUFFIX, AtomicCheckpointIO, clean_stale_temps

from saver import state  # the driver's states, to compare with

HERE = os.path.dirname(os.path.abspath(__file__))

TRIALS = 24


def run_saver(io: str, directory: str, tmpdir: str, trials: int, seed: int = 37, max_delay: float = 0.6) -> list:
    env = {**os.environ, "TMPDIR": tmpdir}
    done = subprocess.run([sys.executable, os.path.join(HERE, "saver.py"), io, directory, str(trials), str(seed),
                           str(max_delay)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["delays"]


def assert_same(loaded: dict, expected: dict) -> None:
    assert loaded["step"] == expected["step"] and loaded["loops"] == expected["loops"]
    assert torch.equal(loaded["state_dict"]["w"], expected["state_dict"]["w"])
    for key, moments in expected["optimizer_states"][0]["state"].items():
        for name, tensor in moments.items():
            assert torch.equal(loaded["optimizer_states"][0]["state"][key][name], tensor), (key, name)


def check_trial(trial_dir: str) -> int:
    """The invariants after a kill; returns how many temps the next start removed."""
    io = AtomicCheckpointIO()
    steps = sorted(int(os.path.basename(p)[5:-5]) for p in glob.glob(os.path.join(trial_dir, "step=*.ckpt")))
    for step in steps:
        assert_same(io.load_checkpoint(os.path.join(trial_dir, f"step={step}.ckpt")), state(step))
    last = os.path.join(trial_dir, "last.ckpt")
    if steps and (os.path.exists(last) or steps[-1] > 1):
        loaded = io.load_checkpoint(last)
        assert loaded["step"] in (steps[-1], steps[-1] - 1), (loaded["step"], steps)
        assert_same(loaded, state(loaded["step"]))
    removed = clean_stale_temps(trial_dir)  # what the next start does
    assert not glob.glob(os.path.join(trial_dir, f"*{TEMP_SUFFIX}")) and not glob.glob(os.path.join(trial_dir, ".*"))
    return len(removed)


@pytest.mark.slow
def test_sigkill_during_saves_across_filesystems_leaves_only_whole_checkpoints(tmp_path, other_filesystem):
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    delays = run_saver("atomic", other_filesystem, str(tmpdir), TRIALS)
    assert len(delays) == TRIALS >= 20
    removed = [check_trial(os.path.join(other_filesystem, f"trial{i}")) for i in range(TRIALS)]
    left = [os.path.join(d, f) for d, _, files in os.walk(tmpdir) for f in files]
    assert left == []  # no file written to $TMPDIR, so none orphaned (torch may make an empty cache dir at import)
    saved = sum(len(glob.glob(os.path.join(other_filesystem, f"trial{i}", "step=*.ckpt"))) for i in range(TRIALS))
    assert saved > TRIALS  # the kills landed among saves, not all before the first
    assert sum(removed) > 0  # ... and some mid-save: their temps were there, and were removed


def test_a_full_checkpoint_disk_keeps_the_previous_checkpoint_and_no_partial_file(tmp_path):
    with mounted_tmpfs(tmp_path, "3m") as small:
        io = AtomicCheckpointIO()
        io.save_checkpoint(state(1), os.path.join(small, "last.ckpt"))  # 2 MB of 3
        for name in ("last.ckpt", "step=2.ckpt"):
            with pytest.raises(OSError, match=rf"no space left in '{small}' to save '{name}'.*kept whole") as err:
                io.save_checkpoint(state(2), os.path.join(small, name))
            assert err.value.errno == errno.ENOSPC
        assert sorted(os.listdir(small)) == ["last.ckpt"]  # no partial step=2.ckpt, no temp
        assert_same(io.load_checkpoint(os.path.join(small, "last.ckpt")), state(1))


def test_a_full_tmpdir_does_not_stop_a_save(tmp_path, monkeypatch):
    """Lightning's IO writes its temp in $TMPDIR: a full $TMPDIR failed saves to a roomy disk."""
    with mounted_tmpfs(tmp_path, "1m") as small:
        with open(os.path.join(small, "filler"), "wb") as f:
            with pytest.raises(OSError):
                f.write(b"\0" * 2**21)
        monkeypatch.setattr(tempfile, "tempdir", small)
        path = tmp_path / "ckpt" / "last.ckpt"
        AtomicCheckpointIO().save_checkpoint(state(3), path)
        assert_same(AtomicCheckpointIO().load_checkpoint(path), state(3))
