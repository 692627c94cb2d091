"""Checkpoint files that survive a kill, a full disk and a bit flip: `AtomicCheckpointIO`.

Why not Lightning's own IO: it serialises to memory, then lets fsspec write a temp file in
``$TMPDIR`` and ``shutil.move`` it, without fsync. When the checkpoint directory is on another
filesystem than ``$TMPDIR`` (a scratch or shared disk; ``/tmp`` local) the move is a copy that
truncates the destination first: a kill mid-save leaves ``last.ckpt`` torn or empty (the previous
one gone), a full disk leaves a partial file under its final name, and the temp stays in
``$TMPDIR``.

Here a save writes a temp file *in the destination directory*, fsyncs it, renames it over the
final name (atomic on one filesystem), then fsyncs the directory; a failed save removes its
temp. A temp left by a killed save (``.<name>.<pid>.<random>.rlpt-tmp``) is removed, and named,
at the next start (`clean_stale_temps`). A load checks the file first (`check_checkpoint_file`):
an empty, torn or corrupted file (torch writes a CRC32 for every record of its zip archive, and
reads none of them back) is refused naming the path, the part and the previous checkpoint beside
it.

`RLModule` installs it in the user's Trainer at ``setup`` when the strategy has Lightning's
default IO (`install_atomic_io`, said once); with another strategy pass it as a plugin:
``Trainer(plugins=[AtomicCheckpointIO()])``. `atomic_write` and `atomic_directory` serve other
writers (`lightning_rlpt.model.export`).
"""
from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import stat
import tempfile
import zipfile
from typing import Any, BinaryIO, Callable, Iterator

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from .processes import pid_alive

TEMP_SUFFIX = ".rlpt-tmp"
ZIP_MAGIC = b"PK\x03\x04"
_said_installed = False  # "said once": the first Trainer of a process tells, later ones do not


class CheckpointFileError(ValueError):
    """A checkpoint file that cannot be trusted: empty, torn (cut off) or corrupted."""


# ---------------------------------------------------------------------------------------- writing
def temp_path(path: str) -> str:
    """A fresh temp name beside ``path`` that `clean_stale_temps` recognises (the pid tells whose)."""
    directory, name = os.path.split(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{name}.{os.getpid()}.", suffix=TEMP_SUFFIX)
    os.close(fd)
    return temp


def file_mode(path: str) -> int:
    """The mode a plain ``open(path, "w")`` leaves: the file's own when it exists, else 0666 less
    the process's umask (read from /proc: setting the umask to read it is a race with other threads)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        pass
    try:
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration):
        umask = 0o022
    return 0o666 & ~umask


def atomic_write(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(file)`` on a temp file beside ``path``, fsync it, rename it to ``path``, fsync
    the directory. On any failure (a full disk, an exception in ``write``) the temp is removed and
    a file already at ``path`` is left as it was.

    Examples:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> atomic_write(os.path.join(d, "a.bin"), lambda f: f.write(b"data"))
        >>> os.listdir(d)
        ['a.bin']
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temp = temp_path(path)
    try:
        os.chmod(temp, file_mode(path))  # mkstemp made it 0600: a shared checkpoint folder could not read it
        with open(temp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as err:
        _remove(temp)
        if _disk_full(err):  # torch reports it as "unexpected pos", the ENOSPC only in the chain
            raise OSError(errno.ENOSPC, f"no space left in {directory!r} to save {os.path.basename(path)!r} "
                          f"({shutil.disk_usage(directory).free / 2**20:.0f} MiB free); nothing was written under "
                          "that name, and a file already there is kept whole. Free space, or point the "
                          "checkpoints elsewhere (ModelCheckpoint(dirpath=...))") from err
        raise
    fsync_directory(directory)


def _disk_full(err: BaseException | None) -> bool:
    """Whether ``err`` or an error it came from is ENOSPC / EDQUOT (a full disk or quota)."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


@contextlib.contextmanager
def atomic_directory(out_dir: str) -> Iterator[str]:
    """A temp directory beside ``out_dir`` to write into; on success its files are fsynced and it is
    renamed to ``out_dir`` (which must be absent or empty); on failure it is removed."""
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    clean_stale_temps(parent, os.path.basename(out_dir))
    temp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out_dir)}.{os.getpid()}.", suffix=TEMP_SUFFIX)
    try:
        yield temp
        for root, _, files in os.walk(temp):
            for name in files:
                _fsync_file(os.path.join(root, name))
            fsync_directory(root)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty (checked by the caller): rename cannot replace a directory
        os.rename(temp, out_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    fsync_directory(parent)


def fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable (a crash could otherwise lose the new entry)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # a platform or filesystem without directory handles: nothing more to do
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some network filesystems refuse fsync on a directory; the rename itself happened
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def clean_stale_temps(directory: str, name: str = "*") -> list[str]:
    """Remove the temps a killed save left in ``directory`` (files or directories named by
    `temp_path` / `atomic_directory` for ``name``, from a process no longer running), saying
    which; returns them."""
    found = glob.glob(os.path.join(glob.escape(directory), f".{name}.*{TEMP_SUFFIX}"))
    stale = [p for p in found if not _writer_alive(p)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else _remove(path)
    if stale:
        rank_zero_warn(f"removed {len(stale)} temp file(s) left by an interrupted save: {sorted(stale)[:5]}")
    return stale


def _writer_alive(path: str) -> bool:
    """Whether the process that named this temp still runs (on this host): its save may be under way."""
    parts = os.path.basename(path).split(".")  # ".<name>.<pid>.<random, no dots>.rlpt-tmp"
    pid = int(parts[-3]) if len(parts) > 3 and parts[-3].isdigit() else None
    return pid is not None and pid != os.getpid() and pid_alive(pid)


# ---------------------------------------------------------------------------------------- reading
def check_checkpoint_file(path: str) -> None:
    """Refuse a checkpoint file that is empty, torn or whose bytes changed since it was written,
    naming the path, the part and what to do. Directories (sharded checkpoints) and missing paths
    are left to the loader."""
    if not os.path.isfile(path):
        return
    size = os.path.getsize(path)
    if size == 0:
        raise CheckpointFileError(f"checkpoint {path!r} is empty (0 bytes): its save was cut off before writing "
                                  f"anything (the process was killed, or the disk was full). {previous_advice(path)}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != ZIP_MAGIC:
        return  # not torch's zip format (a legacy pickle): torch.load decides
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every record and compares its CRC32
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise CheckpointFileError(f"checkpoint {path!r} is torn: {size} bytes, and the archive's index at its end "
                                  f"is missing or damaged ({err}); the save was cut off (killed, or the disk was "
                                  f"full) or the copy is incomplete. {previous_advice(path)}") from None
    if bad is not None:
        raise CheckpointFileError(f"checkpoint {path!r} is corrupted: its part {bad!r} ({describe_record(bad)}) does "
                                  "not match the CRC32 written with it, so its bytes changed after the save (disk, "
                                  f"copy or transfer){changed_parts(path)}. {previous_advice(path)}")


def changed_parts(path: str) -> str:
    """``": the changed part(s): [...]"`` by name, from the checksums `RLModule` wrote inside the
    checkpoint (a tensor's name, e.g. ``optimizer_states.0.state.3.exp_avg``), when it loads."""
    from .checkpoint import tensor_checksums
    from .checkpoint_digest import state_checksums

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        saved = checkpoint["lightning_rlpt"]
        sums = {**(saved.get("state_checksums") or {}), **(saved.get("checksums") or {})}
        now = {**state_checksums(checkpoint), **tensor_checksums(checkpoint.get("state_dict") or {})}
    except Exception:  # noqa: BLE001 - naming is a courtesy: the refusal stands without it
        return ""
    bad = [name for name, crc in sums.items() if name in now and now[name] != crc]
    return f"; the changed part(s): {bad[:5]}{' and more' if len(bad) > 5 else ''}" if bad else ""


def describe_record(record: str) -> str:
    """What a record of torch's zip archive holds."""
    tail = record.rsplit("/", 1)[-1]
    if tail.endswith(".pkl"):
        return "the pickled non-tensor state: loops, callbacks, optimizer settings, hyper-parameters, loaders"
    if record.split("/")[-2:-1] == ["data"]:
        return f"the bytes of tensor storage {tail} (weights, optimizer moments or RNG state)"
    return "archive metadata"


def previous_advice(path: str) -> str:
    """What to do instead: the newest other checkpoint beside ``path``, when there is one."""
    others = [p for p in glob.glob(os.path.join(glob.escape(os.path.dirname(os.path.abspath(path))), "*.ckpt"))
              if os.path.abspath(p) != os.path.abspath(path) and os.path.isfile(p) and os.path.getsize(p) > 0]
    if not others:
        return "Resume from an earlier copy of the run's checkpoints, or start the run again"
    newest = max(others, key=os.path.getmtime)
    return f"Resume from the previous checkpoint, {newest!r} (the newest other one beside it), or from an earlier copy"


# ---------------------------------------------------------------------------------------- the plugin
class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's `TorchCheckpointIO`, saving atomically and refusing untrustworthy files at load.

    Args:
        verify: check every record's CRC32 at load (reads the file once more: about 1 GB/s).

    Examples:
        >>> trainer = L.Trainer(plugins=[AtomicCheckpointIO()])  # doctest: +SKIP
    """

    def __init__(self, verify: bool = True):
        super().__init__()
        self.verify = verify
        self.cleaned: set[str] = set()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options (got {storage_options!r})")
        path = os.fspath(path)
        self.clean_once(os.path.dirname(os.path.abspath(path)))
        with _crc32_on():  # the CRCs are what `check_checkpoint_file` verifies
            atomic_write(path, lambda f: torch.save(checkpoint, f))

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if self.verify:
            check_checkpoint_file(os.fspath(path))
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except (EOFError, RuntimeError) as err:  # what torch raises for a file the checks let through
            raise CheckpointFileError(f"checkpoint {os.fspath(path)!r} cannot be read ({type(err).__name__}: {err}). "
                                      f"{previous_advice(os.fspath(path))}") from err

    def clean_once(self, directory: str) -> None:
        """`clean_stale_temps` the first time this IO meets ``directory``."""
        if directory not in self.cleaned and os.path.isdir(directory):
            clean_stale_temps(directory)
            self.cleaned.add(directory)


@contextlib.contextmanager
def _crc32_on() -> Iterator[None]:
    from torch.utils.serialization import config

    config = config.save
    before = config.compute_crc32
    config.compute_crc32 = True
    try:
        yield
    finally:
        config.compute_crc32 = before


def install_atomic_io(trainer: Any) -> bool:
    """Give ``trainer``'s strategy `AtomicCheckpointIO` when it has Lightning's default IO (a wrapping
    IO, e.g. ``AsyncCheckpointIO``, gets it inside), then clean the temps of the checkpoint
    directories it knows. Another IO the user chose is left alone. Returns whether it installed."""
    strategy = trainer.strategy
    io = strategy.checkpoint_io
    target, attribute = (io, "checkpoint_io") if hasattr(io, "checkpoint_io") else (strategy, "checkpoint_io")
    current = getattr(target, attribute)
    installed = type(current) is TorchCheckpointIO
    if installed:
        current = AtomicCheckpointIO()
        setattr(target, attribute, current)
        _say_installed()
    if isinstance(current, AtomicCheckpointIO):
        for directory in checkpoint_directories(trainer):
            current.clean_once(directory)
    return installed


def _say_installed() -> None:
    global _said_installed
    if not _said_installed:
        rank_zero_info("lightning_rlpt: checkpoints are written atomically (AtomicCheckpointIO: a temp file in the "
                       "checkpoint directory, fsync, rename) and checked when loaded")
        _said_installed = True


def checkpoint_directories(trainer: Any) -> list[str]:
    """The directories this fit writes checkpoints to or resumes from."""
    found = [getattr(cb, "dirpath", None) for cb in getattr(trainer, "checkpoint_callbacks", [])]
    ckpt_path = getattr(trainer, "ckpt_path", None)
    if isinstance(ckpt_path, (str, os.PathLike)) and os.path.isfile(ckpt_path):
        found.append(os.path.dirname(os.path.abspath(ckpt_path)))
    return [os.path.abspath(d) for d in dict.fromkeys(found) if isinstance(d, (str, os.PathLike)) and os.path.isdir(d)]


__all__ = ["AtomicCheckpointIO", "CheckpointFileError", "atomic_directory", "atomic_write",
           "check_checkpoint_file", "clean_stale_temps", "install_atomic_io"]
