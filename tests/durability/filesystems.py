"""Filesystems for the durability tests: a small tmpfs mounted for the test (root, as in CI), or
``/dev/shm`` when mounting is refused, so that the checkpoint directory and ``$TMPDIR`` are two
filesystems (a rename between them is a copy)."""
import contextlib
import os
import subprocess
import uuid

import pytest


@contextlib.contextmanager
def mounted_tmpfs(parent, size: str):
    """A tmpfs of ``size`` mounted under ``parent``; skips the test (saying why) when it cannot mount."""
    where = os.path.join(str(parent), f"tmpfs-{uuid.uuid4().hex[:8]}")
    os.makedirs(where)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", where], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a {size} tmpfs here ({done.stderr.strip() or done.returncode}): the test needs "
                    "root or a mount namespace")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=False)


@pytest.fixture
def other_filesystem(tmp_path):
    """A directory on another filesystem than ``tmp_path`` (where ``$TMPDIR`` points in the tests)."""
    with contextlib.ExitStack() as stack:
        try:
            where = stack.enter_context(mounted_tmpfs(tmp_path, "256m"))
        except pytest.skip.Exception:
            where = os.path.join("/dev/shm", f"rlpt-{uuid.uuid4().hex[:8]}")
            os.makedirs(where)
            stack.callback(subprocess.run, ["rm", "-rf", where], check=False)
        if os.stat(where).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip(f"{where} and {tmp_path} are one filesystem here: the cross-filesystem case cannot be made")
        yield where
