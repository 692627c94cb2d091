"""Issue 37 items 1-2 through a user's own Trainer: `AtomicCheckpointIO` is installed without extra
code (and a strategy's other IO left alone), a killed save's temp is removed at the next start,
and an empty, torn or corrupted checkpoint is refused naming the path, the part and the previous
checkpoint; a change in the optimizer state is refused by the whole-state checksums.

Seen failing on the previous code: a 0-byte ``last.ckpt`` raised a bare ``EOFError`` (no path),
a torn one torch's zip error, and an Adam ``step`` of 2.1e10 or a changed ``exp_avg`` resumed and
trained silently."""
import os
import zipfile

import pytest
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.checkpoint_io import AtomicCheckpointIO, CheckpointFileError


def make_module(warm_start_dir):
    return RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=4, lr=1e-3, seed=5,
                    generation=dict(max_new_tokens=4, max_prompt_length=8))


def fit(warm_start_dir, rows, steps, dirpath, ckpt_path=None, **trainer_kwargs):
    trainer = quiet_trainer(max_steps=steps, enable_checkpointing=True, callbacks=[
        ModelCheckpoint(dirpath=dirpath, filename="{step}", every_n_train_steps=1, save_top_k=-1, save_last=True)],
        **trainer_kwargs)
    trainer.fit(make_module(warm_start_dir), datamodule=PromptDataModule(rows, batch_size=2, seed=7),
                ckpt_path=ckpt_path)
    return trainer


@pytest.fixture(scope="module")
def run_dir(warm_start_dir, arithmetic_rows, tmp_path_factory):
    """Two steps of a plain user's fit: step=1.ckpt, step=2.ckpt, last.ckpt, with a temp of a
    killed save planted in the directory beforehand (pid 999999 is not running)."""
    out = tmp_path_factory.mktemp("run")
    stale = out / ".last.ckpt.999999.abcd1234.rlpt-tmp"
    stale.write_bytes(b"half a checkpoint")
    with pytest.warns(UserWarning, match=r"removed 1 temp file\(s\) left by an interrupted save"):
        trainer = fit(warm_start_dir, arithmetic_rows, 2, str(out))
    assert type(trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    assert not stale.exists()
    return out


def test_the_users_trainer_writes_through_atomic_io(run_dir):
    assert sorted(os.listdir(run_dir)) == ["last.ckpt", "step=1.ckpt", "step=2.ckpt"]


def test_an_io_the_user_chose_is_left_alone(warm_start_dir, arithmetic_rows, tmp_path):
    class Mine(TorchCheckpointIO):
        pass

    trainer = fit(warm_start_dir, arithmetic_rows, 1, str(tmp_path), plugins=[Mine()])
    assert type(trainer.strategy.checkpoint_io) is Mine


def resume(warm_start_dir, rows, path, tmp_path):
    fit(warm_start_dir, rows, 3, str(tmp_path / "again"), ckpt_path=str(path))


def copy_with(run_dir, tmp_path, change) -> str:
    """``last.ckpt`` copied beside a copy of ``step=1.ckpt`` (the previous checkpoint), then changed."""
    for name in ("step=1.ckpt", "last.ckpt"):
        (tmp_path / name).write_bytes((run_dir / name).read_bytes())
    os.utime(tmp_path / "step=1.ckpt", (1, 1))
    path = tmp_path / "last.ckpt"
    path.write_bytes(change(path.read_bytes()))
    return path


@pytest.mark.parametrize("change, message", [
    (lambda data: b"", r"is empty \(0 bytes\): its save was cut off"),
    (lambda data: data[:len(data) // 2], r"is torn: \d+ bytes, and the archive's index at its end is missing"),
], ids=["empty", "torn"])
def test_an_empty_or_torn_checkpoint_is_refused_naming_the_previous(run_dir, warm_start_dir, arithmetic_rows,
                                                                    tmp_path, change, message):
    path = copy_with(run_dir, tmp_path, change)
    with pytest.raises(CheckpointFileError, match=rf"checkpoint '{path}' {message}.*previous checkpoint, "
                                                  rf"'{tmp_path / 'step=1.ckpt'}'"):
        resume(warm_start_dir, arithmetic_rows, path, tmp_path)


def adam_step_record(path) -> tuple[str, int]:
    """The archive record holding one Adam ``step`` (a float32 scalar 2.0) and its data's offset."""
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.file_size == 4 and archive.read(info) == torch.tensor(2.0).numpy().tobytes():
                with open(path, "rb") as f:
                    f.seek(info.header_offset + 26)
                    name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
                return info.filename, info.header_offset + 30 + name_len + extra_len
    raise AssertionError("no Adam step record found")


def test_a_bit_flip_in_the_optimizer_state_is_refused_naming_it(run_dir, warm_start_dir, arithmetic_rows, tmp_path):
    """Adam's step 2.0 with bit 30 of its float flipped (2.0 -> 3.4e38 region): before, it trained on."""
    def flip(data):
        record, offset = adam_step_record(tmp_path / "last.ckpt")
        return data[:offset + 3] + bytes([data[offset + 3] ^ 0x20]) + data[offset + 4:]

    path = copy_with(run_dir, tmp_path, flip)
    with pytest.raises(CheckpointFileError, match=r"is corrupted: its part 'archive/data/\d+' \(the bytes of tensor "
                                                  r"storage .*changed part\(s\): \['optimizer_states\.0\.state\.\d+\.step'\]"):
        resume(warm_start_dir, arithmetic_rows, path, tmp_path)


def test_a_changed_optimizer_state_rewritten_whole_is_refused_by_the_state_checksums(run_dir, warm_start_dir,
                                                                                    arithmetic_rows, tmp_path):
    """A change the file's own CRCs cannot see (the state changed, then written again, e.g. by a tool
    or through another IO): the checksums `RLModule` wrote over the whole state refuse it by name."""
    state = torch.load(run_dir / "last.ckpt", weights_only=False)
    first = next(iter(state["optimizer_states"][0]["state"]))
    state["optimizer_states"][0]["state"][first]["step"].fill_(2.1e10)
    path = tmp_path / "rewritten.ckpt"
    torch.save(state, path)
    with pytest.raises(ValueError, match=rf"part\(s\) \['optimizer_states\.0\.state\.{first}\.step'\] do not match "
                                         r"the checksum.*Resume from the previous checkpoint"):
        resume(warm_start_dir, arithmetic_rows, path, tmp_path)


def test_an_export_is_written_whole_or_not_at_all(run_dir, tmp_path, monkeypatch):
    """`export_checkpoint` writes into a temp directory beside the target and renames it: a failure
    midway (here the tokenizer's files: a full disk, a kill) leaves neither the target nor a temp."""
    from lightning_rlpt.model import export

    out = tmp_path / "exported"
    with monkeypatch.context() as patch:
        def fail(*_, **__):
            raise OSError(28, "No space left on device")
        patch.setattr("transformers.PreTrainedTokenizerFast.save_pretrained", fail)
        with pytest.raises(OSError, match="No space left"):
            export.export_checkpoint(str(run_dir / "last.ckpt"), str(out))
    assert os.listdir(tmp_path) == []  # the model files written before the failure went with the temp
    export.export_checkpoint(str(run_dir / "last.ckpt"), str(out))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))


def test_an_export_of_an_empty_checkpoint_is_refused_naming_it(tmp_path):
    from lightning_rlpt.model import export

    (tmp_path / "last.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointFileError, match=r"last.ckpt' is empty \(0 bytes\)"):
        export.export_checkpoint(str(tmp_path / "last.ckpt"), str(tmp_path / "out"))


def test_an_atomic_write_leaves_the_mode_a_plain_write_would(tmp_path):
    """mkstemp makes its temp 0600: renamed as it is, a checkpoint in a folder shared with a group
    (an evaluation job, a colleague) could not be read. A new file gets 0666 less the umask; a
    file written over keeps its own mode."""
    from lightning_rlpt.checkpoint_io import atomic_write

    old = os.umask(0o027)
    try:
        atomic_write(str(tmp_path / "new.ckpt"), lambda f: f.write(b"x"))
        (tmp_path / "kept.ckpt").write_bytes(b"old")
        os.chmod(tmp_path / "kept.ckpt", 0o604)
        atomic_write(str(tmp_path / "kept.ckpt"), lambda f: f.write(b"new"))
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "new.ckpt").st_mode & 0o777) == oct(0o640)
    assert oct(os.stat(tmp_path / "kept.ckpt").st_mode & 0o777) == oct(0o604)
    assert (tmp_path / "kept.ckpt").read_bytes() == b"new"
