"""PromptDataModule: every source, column maps, bad input, and the resumable loader."""
import json

import datasets
import pytest

from lightning_rlpt.data import PromptDataModule, ResumableLoader

ROWS = [{"question": f"{i}+1=", "solution": str(i + 1)} for i in range(10)]


def _first_batch(dm):
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.fixture
def files(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS))
    parquet = tmp_path / "p.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(parquet))
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(saved))
    return {"jsonl": str(jsonl), "parquet": str(parquet), "saved": str(saved)}


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "saved", "dataset", "list"])
def test_sources_and_column_map(files, kind):
    data = {"dataset": datasets.Dataset.from_list(ROWS), "list": ROWS}.get(kind) or files[kind]
    dm = PromptDataModule(data, prompt_column="question", columns={"solution": "answer"}, batch_size=3, shuffle=False)
    batch = _first_batch(dm)
    assert batch["prompt"] == ["0+1=", "1+1=", "2+1="]
    assert batch["answer"] == ["1", "2", "3"] and batch["index"] == [0, 1, 2]


def test_list_of_strings_and_val_fraction():
    dm = PromptDataModule([f"p{i}" for i in range(10)], val_fraction=0.2, batch_size=4)
    dm.setup("fit")
    assert len(dm.train_set) == 8 and len(dm.val_set) == 2
    assert set(dm.val_set.rows[0]) == {"prompt"}


def test_empty_dataset():
    with pytest.raises(ValueError, match="training dataset is empty"):
        PromptDataModule([]).setup("fit")


def test_missing_column_lists_available():
    with pytest.raises(ValueError, match=r"no column\(s\) \['prompt'\]; its columns are \['question', 'solution'\]"):
        PromptDataModule(ROWS).setup("fit")
    with pytest.raises(ValueError, match=r"no column\(s\) \['answer'\]"):
        PromptDataModule(ROWS, prompt_column="question", columns={"answer": "x"}).setup("fit")


def test_missing_path_and_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PromptDataModule(str(tmp_path / "nope.jsonl")).setup("fit")
    bad = tmp_path / "p.txt"
    bad.write_text("x")
    with pytest.raises(ValueError, match="use .jsonl"):
        PromptDataModule(str(bad)).setup("fit")


def test_shuffle_is_seeded_per_epoch():
    dm = PromptDataModule(ROWS, prompt_column="question", batch_size=10, seed=3)
    loader = dm.train_dataloader()
    first = next(iter(loader))["index"]
    again = next(iter(dm.train_dataloader()))["index"]
    loader.sampler.set_epoch(1)
    second = next(iter(loader))["index"]
    assert first == again and first != second and sorted(first) == list(range(10))


def test_resumable_loader_skips_consumed_batches():
    dm = PromptDataModule(ROWS, prompt_column="question", batch_size=2, seed=1)
    loader = dm.train_dataloader()
    it = iter(loader)
    seen = [next(it)["index"] for _ in range(2)]
    state = loader.state_dict()
    assert state == {"consumed": 2, "epoch": 0}  # the epoch: a later epoch skips nothing (test_resume_at_epoch_end)
    rest = [b["index"] for b in it]
    fresh = dm.train_dataloader()
    assert isinstance(fresh, ResumableLoader)
    fresh.load_state_dict(state)
    assert [b["index"] for b in fresh] == rest
    assert [b["index"] for b in fresh][:2] == seen  # the skip applies to one iteration only
