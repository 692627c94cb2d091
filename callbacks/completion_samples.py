"""`CompletionSamples`: a table of prompts, completions and rewards every N rollouts."""
from __future__ import annotations

import csv
import os
from typing import Any

import lightning as L
import torch

from lightning_rlpt.experience import Experience
from lightning_rlpt.hooks import RLCallback


class CompletionSamples(RLCallback):
    """Log a few completions with their rewards as a table, so you can read what the policy writes.

    Every ``every_n_steps``-th rollout (training batch; the first one included) it picks
    ``num_samples`` completions spread evenly over the batch and records ``step`` (the trainer's
    global step when they were sampled), ``prompt``, ``completion``, ``reward`` (the weighted score, `Experience.scores`), one
    ``reward/<function>`` column per reward function and ``advantage`` (when the batch reaches
    advantage computation). With tools or an environment the completion is the whole episode,
    every turn as ``role: content`` (assistant turns, tool results, observations). Rows are appended to ``completions.csv`` in the trainer's log
    directory and sent to each logger's table API: TensorBoard ``add_text`` (a Markdown table),
    MLflow ``log_table`` (artifact ``completions.json``), W&B ``log_table`` (key
    ``completions``). Only global rank 0 writes; it logs rank 0's samples.

    Args:
        every_n_steps: rollouts between two tables (1 = every rollout).
        num_samples: completions per table (at most the batch's size).
        filename: CSV file name, or an absolute path.
        max_chars: cut prompts and completions to this many characters in logger tables
            (the CSV keeps them whole).

    Examples:
        >>> trainer = L.Trainer(callbacks=[CompletionSamples(every_n_steps=10, num_samples=4)])  # doctest: +SKIP
    """

    requires = ("reward_names",)

    def __init__(self, every_n_steps: int = 50, num_samples: int = 8, filename: str = "completions.csv",
                 max_chars: int = 500):
        if every_n_steps < 1 or num_samples < 1:
            raise ValueError(f"every_n_steps and num_samples must be >= 1 (got {every_n_steps}, {num_samples})")
        self.every_n_steps, self.num_samples = every_n_steps, num_samples
        self.filename, self.max_chars = filename, max_chars
        self.rollouts = 0  # rollouts seen (the schedule's counter, checkpointed)
        self.rows_written = 0
        self._pending: list[dict[str, Any]] = []
        self._picked: list[int] = []
        self._experience_id: tuple[int, list[str]] = (0, [])

    @property
    def state_key(self) -> str:
        return self._generate_state_key(every_n_steps=self.every_n_steps, filename=self.filename)

    # ---------------------------------------------------------------- hooks
    def on_rewards_computed(self, trainer: L.Trainer, module: Any, experience: Experience) -> None:
        due = self.rollouts % self.every_n_steps == 0
        self.rollouts += 1
        self._pending, self._picked = [], []
        if not due or trainer.global_rank != 0 or len(experience) == 0:
            return None
        n = len(experience)
        self._picked = sorted(set(torch.linspace(0, n - 1, min(self.num_samples, n)).round().long().tolist()))
        names = module.reward_names
        per_func = experience.rewards_per_func.detach().cpu()
        for i in self._picked:
            row = {"step": trainer.global_step, "prompt": _text(experience.prompts[i]),
                   "completion": _completion(experience, i), "reward": float(experience.scores[i])}
            # NaN: the function returned None ("does not apply"); an empty cell, like a missing advantage
            row.update({f"reward/{name}": None if per_func[i, j].isnan() else float(per_func[i, j])
                        for j, name in enumerate(names)})
            row["advantage"] = None
            self._pending.append(row)
        self._experience_id = (n, [experience.completions[i] for i in self._picked])
        return None

    def on_advantages_computed(self, trainer: L.Trainer, module: Any, experience: Experience) -> None:
        # Filtering callbacks may have replaced the batch: attach advantages only to the same rows.
        if self._pending and experience.advantages is not None and self._same_rows(experience):
            for row, i in zip(self._pending, self._picked):
                row["advantage"] = float(experience.advantages[i])
        return None

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        self._write_csv(trainer, rows)
        for logger in trainer.loggers:
            _log_table(logger, rows, rows[0]["step"], self.max_chars)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, int]:
        return {"rollouts": self.rollouts, "rows_written": self.rows_written}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.rollouts, self.rows_written = int(state_dict["rollouts"]), int(state_dict["rows_written"])

    # ---------------------------------------------------------------- helpers
    def _same_rows(self, experience: Experience) -> bool:
        n, texts = self._experience_id
        return len(experience) == n and [experience.completions[i] for i in self._picked] == texts

    def csv_path(self, trainer: L.Trainer) -> str:
        """Where the rows go: ``filename`` in ``trainer.log_dir`` (the logger's directory)."""
        return self.filename if os.path.isabs(self.filename) else os.path.join(trainer.log_dir or ".", self.filename)

    def _write_csv(self, trainer: L.Trainer, rows: list[dict[str, Any]]) -> None:
        path = self.csv_path(trainer)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)
        self.rows_written += len(rows)


def _completion(experience: Experience, i: int) -> str:
    """Row ``i``'s completion; a multi-turn episode (tools, environments) whole, one message per
    line block (``assistant: ...``, ``tool: ...``, ``user: ...``), so tool results show."""
    messages = experience.columns.get("completion_messages")
    return experience.completions[i] if messages is None else _text(messages[i])


def _text(prompt: Any) -> str:
    """A conversational prompt (list of messages) as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)


def _log_table(logger: Any, rows: list[dict[str, Any]], step: int, max_chars: int) -> None:
    """Send the rows to a logger's table/text API; loggers without one only get the CSV."""
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger

    columns = list(rows[0])
    cut = [{k: v[:max_chars] if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_text("completions", _markdown(columns, cut), global_step=step)
    elif isinstance(logger, MLFlowLogger):
        logger.experiment.log_table(logger.run_id, data={c: [r[c] for r in cut] for c in columns},
                                    artifact_file="completions.json")
    elif hasattr(logger, "log_table"):  # WandbLogger (and any logger with the same API)
        logger.log_table(key="completions", columns=columns, data=[[r[c] for c in columns] for r in cut], step=step)


def _markdown(columns: list[str], rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        v = "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
        return v.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
