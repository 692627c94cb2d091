"""Prompts in, batches of prompt strings and their columns out; resumable mid-epoch."""
from __future__ import annotations

import os
from typing import Any, Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from ..quiet import quiet_empty_validation
from .checks import check_prompts, check_same_columns, json_row_keys, read_utf8
from .samplers import EpochSampler

DataSource = Any  # path (.jsonl/.json/.parquet/.csv or a saved datasets dir), datasets.Dataset, list


def load_rows(data: DataSource) -> list[dict[str, Any]]:
    """Rows as dicts from any supported source; rows whose columns differ from the others' are
    refused (`checks.check_same_columns`), naming the file and line."""
    if isinstance(data, (str, os.PathLike)):
        return _load_path(str(data))
    if hasattr(data, "to_list") and hasattr(data, "column_names"):  # datasets.Dataset
        return data.to_list()
    _reject_dataset_dict(data, "")
    if isinstance(data, Sequence):
        rows = [r if isinstance(r, dict) else {"prompt": r} for r in data]
        check_same_columns([list(r) for r in rows], "the list of prompt rows")
        return rows
    raise TypeError(f"unsupported data {type(data).__name__}: pass a file path, a datasets.Dataset or a list")


def _load_path(path: str) -> list[dict[str, Any]]:
    import datasets

    if not os.path.exists(path):
        raise FileNotFoundError(f"prompt data {path!r} does not exist")
    if os.path.isdir(path):
        try:
            saved = datasets.load_from_disk(path)
        except FileNotFoundError as err:
            raise ValueError(f"{path!r} is a directory but not one written by Dataset.save_to_disk ({err}); pass "
                             "such a directory or a .jsonl/.json/.parquet/.csv file") from err
        _reject_dataset_dict(saved, path)
        return saved.to_list()
    kinds = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
    ext = os.path.splitext(path)[1]
    if ext not in kinds:
        raise ValueError(f"cannot read {path!r}: use .jsonl, .json, .parquet, .csv or a saved datasets directory")
    if ext != ".parquet":  # text: check its encoding and (JSON) every row's keys before `datasets` hides both
        text = read_utf8(path)
        if not text.strip():  # `datasets` would fail with a bare StopIteration, naming no file
            raise ValueError(f"prompt data {path!r} is empty: it holds no rows. Give it at least one row (for JSON "
                             "lines, one object per line, e.g. {\"prompt\": \"1+1=\", \"answer\": \"2\"})")
        if kinds[ext] == "json":
            keys, lines = json_row_keys(path, text)
            check_same_columns(keys, repr(path), lines)
    return datasets.load_dataset(kinds[ext], data_files=path, split="train").to_list()


def _named(what: str, data: DataSource) -> str:
    """``what``, with the file it came from when it came from one (for error messages)."""
    return f"{what} {str(data)!r}" if isinstance(data, (str, os.PathLike)) else what


def _reject_dataset_dict(data: Any, path: str) -> None:
    """A DatasetDict holds several splits: make the user pick one rather than guess."""
    import sys

    datasets = sys.modules.get("datasets")  # not imported here: a DatasetDict means it already is
    if datasets is not None and isinstance(data, datasets.DatasetDict):
        fix = " or ".join(repr(os.path.join(path, s)) for s in data) if path else \
            " or ".join(f"dataset_dict[{s!r}]" for s in data)
        raise ValueError(f"got a DatasetDict with splits {list(data)}; pass one split, e.g. {fix}")


class PromptDataset(Dataset):
    """Rows with a prompt column; every other column is passed to reward functions.

    Args:
        rows: list of dicts.
        prompt_column: the column holding the prompt (a string, or a list of
            ``{"role", "content"}`` messages).
        columns: maps dataset column names to the names reward functions receive
            (e.g. ``{"solution": "answer"}``); unmapped columns keep their names. Mapping a
            column to ``"prompt"`` makes it the prompt column.
        name: what to call the dataset in error messages.

    Examples:
        >>> rows = [{"question": "1+1=", "solution": "2"}]
        >>> PromptDataset(rows, columns={"question": "prompt", "solution": "answer"})[0]
        {'answer': '2', 'prompt': '1+1=', 'index': 0}
    """

    def __init__(self, rows: list[dict[str, Any]], prompt_column: str = "prompt",
                 columns: dict[str, str] | None = None, name: str = "dataset"):
        if len(rows) == 0:
            raise ValueError(f"the {name} is empty: give at least one prompt")
        self.columns = dict(columns or {})
        self.prompt_column = _prompt_column(prompt_column, self.columns)
        check_same_columns([list(r) for r in rows], f"the {name}")  # so row 0's columns are every row's
        available = list(rows[0])
        missing = [c for c in [self.prompt_column, *self.columns] if c not in available]
        if missing:
            raise ValueError(f"the {name} has no column(s) {missing}; its columns are {available}. "
                             "Set prompt_column= / columns= to names that exist")
        _check_output_names({c: self.columns.get(c, c) for c in available if c != self.prompt_column}, name)
        check_prompts([r[self.prompt_column] for r in rows], self.prompt_column, f"the {name}")
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        out = {self.columns.get(k, k): v for k, v in row.items() if k != self.prompt_column}
        out["prompt"] = row[self.prompt_column]
        out["index"] = i
        return out


# Filled in by PromptDataset ("prompt", "index") or by the reward call (the rest).
RESERVED_COLUMNS = ("prompt", "index", "prompts", "completions", "completion_ids", "trainer_state")


def _prompt_column(prompt_column: str, columns: dict[str, str]) -> str:
    """The prompt column, which ``columns={"question": "prompt"}`` may name instead of ``prompt_column``."""
    mapped = [c for c, new in columns.items() if new == "prompt"]
    if len(mapped) > 1:
        raise ValueError(f"columns= maps {mapped} all to 'prompt'; map exactly one column to 'prompt'")
    if not mapped:
        return prompt_column
    if prompt_column not in ("prompt", mapped[0]):
        raise ValueError(f"prompt_column={prompt_column!r} and columns= mapping {mapped[0]!r} to 'prompt' disagree; "
                         "name the prompt column in one of them")
    return mapped[0]


def _check_output_names(renames: dict[str, str], name: str) -> None:
    """Reward functions get one keyword per column: no two may share a name or take a reserved one."""
    names = list(renames.values())
    clashes = sorted({n for n in names if names.count(n) > 1 or n in RESERVED_COLUMNS})
    if clashes:
        source = next(c for c, n in renames.items() if n == clashes[0])
        raise ValueError(f"in the {name}, column name(s) {clashes} would clash (two columns with one name, or a name "
                         f"reserved for {list(RESERVED_COLUMNS)}); rename them with columns=, e.g. "
                         f"columns={{{source!r}: 'my_{source}'}}")


def collate_prompts(items: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """A batch is a dict of lists (no tensors: the module tokenizes)."""
    return {k: [it[k] for it in items] for k in items[0]}


class ResumableLoader(DataLoader):
    """A DataLoader whose ``state_dict`` records the batches consumed this epoch and the epoch;
    after ``load_state_dict`` the iteration of that same epoch skips them, so a run resumed
    mid-epoch sees the same prompts as one that never stopped.

    A checkpoint taken after an epoch's last batch (every N steps landing there, at epoch end, or
    at ``limit_train_batches``) makes Lightning resume in the *next* epoch, where there is
    nothing to skip: skipping there would drop that epoch's first batches and silently train on
    others. The epoch is the sampler's (``set_epoch``, which Lightning calls before each
    epoch); a sampler without one, or a checkpoint from before the epoch was recorded, falls back
    to "a whole epoch consumed skips nothing".
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._consumed, self._epoch = 0, None
        self._skip: tuple[int, int | None] = (0, None)  # (batches, the epoch they belong to)

    def __iter__(self):
        (skip, epoch), self._skip = self._skip, (0, None)
        self._epoch, self._consumed = self._sampler_epoch(), 0
        if epoch is not None and epoch != self._epoch:
            skip = 0  # Lightning resumed in a later epoch: the recorded one was finished
        for i, batch in enumerate(super().__iter__()):
            if i < skip:
                continue
            self._consumed = i + 1
            yield batch

    def _sampler_epoch(self) -> int | None:
        epoch = getattr(self.sampler, "epoch", None)
        return int(epoch) if isinstance(epoch, int) else None

    def state_dict(self) -> dict[str, int]:
        state = {"consumed": self._consumed}
        if self._epoch is not None:
            state["epoch"] = self._epoch
        return state

    def load_state_dict(self, state: dict[str, int]) -> None:
        consumed, epoch = int(state.get("consumed", 0)), state.get("epoch")
        if epoch is None and consumed >= len(self):  # no epoch recorded: a finished epoch skips nothing
            consumed = 0
        self._skip = (consumed, epoch)


class PromptDataModule(L.LightningDataModule):
    """Prompts for RL: train and validation loaders of prompt strings plus columns.

    Args:
        data: training prompts — a .jsonl/.json/.parquet/.csv path, a saved ``datasets``
            directory, a ``datasets.Dataset``, a list of dicts or a list of strings.
        val_data: validation prompts (same forms); or use ``val_fraction``.
        val_fraction: hold out this fraction of ``data`` (seeded) when ``val_data`` is None.
        prompt_column / columns: see `PromptDataset`.
        batch_size: prompts per training batch and rank (each gets ``group_size`` completions);
            a step over w ranks trains on the same w·batch_size prompts that one rank with
            batch size w·batch_size would (see `EpochSampler`).
        val_batch_size: prompts per validation batch (default ``batch_size``).
        shuffle: shuffle training prompts each epoch (seeded by ``seed + epoch``).

    Examples:
        >>> dm = PromptDataModule([{"prompt": "1+1=", "answer": "2"}] * 4, batch_size=2)
        >>> dm.setup("fit"); next(iter(dm.train_dataloader()))["answer"]
        ['2', '2']
    """

    def __init__(self, data: DataSource, *, val_data: DataSource | None = None, val_fraction: float = 0.0,
                 prompt_column: str = "prompt", columns: dict[str, str] | None = None, batch_size: int = 8,
                 val_batch_size: int | None = None, shuffle: bool = True, seed: int = 0, num_workers: int = 0):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1) (got {val_fraction})")
        self.data, self.val_data, self.val_fraction = data, val_data, val_fraction
        self.prompt_column, self.columns = prompt_column, columns
        self.batch_size, self.val_batch_size = batch_size, val_batch_size or batch_size
        self.shuffle, self.seed, self.num_workers = shuffle, seed, num_workers
        self.train_set: PromptDataset | None = None
        self.val_set: PromptDataset | None = None
        # A curriculum callback may install a weighted sampler (`data/samplers.py`) here.
        self.train_sampler: EpochSampler | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        rows = load_rows(self.data)
        val_rows = load_rows(self.val_data) if self.val_data is not None else []
        train_name, val_name = _named("training dataset", self.data), _named("validation dataset", self.val_data)
        if self.val_data is None and self.val_fraction > 0:
            # Check every row before the seeded split, so that an error numbers rows as the source does.
            PromptDataset(rows, self.prompt_column, self.columns, train_name)
            order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(self.seed)).tolist()
            cut = max(1, int(len(rows) * self.val_fraction))
            val_rows, rows = [rows[i] for i in order[:cut]], [rows[i] for i in order[cut:]]
            val_name = f"validation split of the {train_name}"
        self.train_set = PromptDataset(rows, self.prompt_column, self.columns, train_name)
        if val_rows or self.val_data is not None:
            self.val_set = PromptDataset(val_rows, self.prompt_column, self.columns, val_name)

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        sampler = self.train_sampler
        if sampler is None:
            sampler = EpochSampler(len(self.train_set), self.shuffle, self.seed, self.batch_size)
        return ResumableLoader(self.train_set, batch_size=self.batch_size, sampler=sampler,
                               collate_fn=collate_prompts, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader | list:
        self.setup("validate")
        if self.val_set is None:
            quiet_empty_validation()  # the empty list is how Lightning is told "no validation"
            return []
        return DataLoader(self.val_set, batch_size=self.val_batch_size, shuffle=False,
                          collate_fn=collate_prompts, num_workers=self.num_workers)
