"""Two CPU processes (DDP, gloo) roll out the *same* prompt at temperature 2 and record, per rank,
the completions of every rollout: once straight through ``--steps`` steps, once stopped after
one step and resumed from its checkpoint (Lightning's launcher re-runs this script per rank).

    python tests/scripts/rank_seeds_fit.py --out DIR [--steps 3]

Writes ``DIR/completions_rank{r}.json``: ``{"straight": [[step, ids], ...], "resumed": [...]}``.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the tiny task

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import tiny_task as task  # noqa: E402
from lightning_rlpt import PromptDataModule, RLCallback, RLModule  # noqa: E402
from lightning_rlpt.model.distributed import release_process_group  # noqa: E402


class CompletionRecorder(RLCallback):
    """Each rollout's completion ids on this rank."""

    def __init__(self, into: list):
        self.into = into

    def on_rollout_end(self, trainer, module, experience):
        self.into.append([trainer.global_step, experience.completion_ids.tolist()])


def fit(out: str, steps: int, record: list, callbacks=(), ckpt_path: str | None = None) -> L.Trainer:
    module = RLModule(os.path.join(ROOT, "examples", "arithmetic", "warm_start"), reward_funcs=[task.exact_answer],
                      group_size=4, kl_coef=0.0, lr=1e-4, seed=3,
                      generation=dict(max_new_tokens=4, max_prompt_length=8, temperature=2.0))
    train, _ = task.split_pairs()
    rows = task.rows(train[:1]) * 8  # one prompt: both ranks roll out the same text in every row
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(callbacks),
                        callbacks=[CompletionRecorder(record), *callbacks])
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=1, seed=1), ckpt_path=ckpt_path)
    return trainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    record: dict[str, list] = {"straight": [], "resumed": []}
    fit(args.out, args.steps, record["straight"])
    every = ModelCheckpoint(dirpath=args.out, filename="ckpt", every_n_train_steps=1)
    fit(args.out, 1, record["resumed"], callbacks=[every])
    trainer = fit(args.out, args.steps, record["resumed"], ckpt_path=os.path.join(args.out, "ckpt.ckpt"))
    with open(os.path.join(args.out, f"completions_rank{trainer.global_rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
    release_process_group()  # before finalization, where gloo can abort an exit that succeeded
