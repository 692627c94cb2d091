"""Fit 2N steps straight through vs N steps, stop, resume from the checkpoint, N more."""
from __future__ import annotations

import csv
import glob
import os
from typing import Callable

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from conftest import NOT_COMPARED, quiet_trainer


def read_rows(root: str, skip: tuple[str, ...] = NOT_COMPARED) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` merged over every metrics.csv under ``root``, less ``skip``'s prefixes."""
    out: dict[int, dict[str, float]] = {}
    for path in sorted(glob.glob(os.path.join(root, "**", "metrics.csv"), recursive=True)):
        with open(path) as f:
            for row in csv.DictReader(f):
                step = int(row.pop("step"))
                row.pop("epoch", None)
                out.setdefault(step, {}).update({k: float(v) for k, v in row.items()
                                                 if v != "" and not k.startswith(skip)})
    return out


def straight_and_resumed(tmp_path, make_module: Callable, make_data: Callable, make_callbacks: Callable = list,
                         n: int = 4, **trainer_kwargs):
    """Returns ((metrics, weights) straight, (metrics, weights) resumed); ``trainer_kwargs``
    go to every Trainer (e.g. a validation schedule)."""
    runs = []
    for name, plan in (("straight", [2 * n]), ("resumed", [n, 2 * n])):
        root, ckpt_dir = str(tmp_path / name), str(tmp_path / name / "ckpt")
        module = None
        for i, steps in enumerate(plan):
            module = make_module()
            checkpoint = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=n, save_top_k=-1)
            trainer = quiet_trainer(max_steps=steps, logger=CSVLogger(root, name="", version=f"part{i}"),
                                    callbacks=[*make_callbacks(), checkpoint], enable_checkpointing=True,
                                    **trainer_kwargs)
            trainer.fit(module, datamodule=make_data(), ckpt_path=os.path.join(ckpt_dir, "last.ckpt") if i else None)
        runs.append((read_rows(root), {k: v.detach().clone() for k, v in module.policy.state_dict().items()}))
    return runs[0], runs[1]


def assert_same_run(straight, resumed, atol: float = 1e-6) -> None:
    (m1, w1), (m2, w2) = straight, resumed
    assert sorted(m1) == sorted(m2), f"logged steps differ: {sorted(m1)} vs {sorted(m2)}"
    for step in m1:
        assert m1[step].keys() == m2[step].keys(), f"step {step}: metric names differ"
        for key, value in m1[step].items():
            assert abs(value - m2[step][key]) <= atol, f"step {step} {key}: {value} vs {m2[step][key]}"
    assert w1.keys() == w2.keys()
    for key in w1:
        assert torch.allclose(w1[key].float(), w2[key].float(), atol=1e-6, rtol=0), f"weight {key} differs"
